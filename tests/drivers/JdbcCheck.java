// pgJDBC through pgtenant: exits non-zero on the first mismatch.
// usage: java -cp postgresql.jar JdbcCheck.java PORT
import java.sql.*;
import java.util.Properties;

public class JdbcCheck {
  static void check(boolean ok, String what) {
    if (!ok) throw new AssertionError(what);
  }

  public static void main(String[] args) throws Exception {
    String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/app";
    Properties p = new Properties();
    p.setProperty("user", "app");
    p.setProperty("password", "app");
    p.setProperty("sslmode", "disable");
    p.setProperty("options", "-c pgtenant.tenant_id=1500");
    p.setProperty("prepareThreshold", "2");
    try (Connection c = DriverManager.getConnection(url, p)) {
      try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("select shard_id from pgtenant_shard")) {
        r.next();
        check(r.getInt(1) == 2, "tenant 1500 is on shard 2");
      }
      try (PreparedStatement ps = c.prepareStatement("select ?::int * 2")) {
        for (int i = 0; i < 6; i++) { // server-side prepared from the second execution
          ps.setInt(1, i);
          try (ResultSet r = ps.executeQuery()) { r.next(); check(r.getInt(1) == i * 2, "prepared result"); }
        }
      }
      try (Statement s = c.createStatement()) { s.execute("create table if not exists jdbc_t (tenant_id bigint, v text)"); }
      c.setAutoCommit(false);
      try (Statement s = c.createStatement()) {
        s.execute("insert into jdbc_t values (1500, 'rolled back')");
        c.rollback();
        try (ResultSet r = s.executeQuery("select count(*) from jdbc_t where v = 'rolled back'")) {
          r.next();
          check(r.getInt(1) == 0, "rollback");
        }
        c.commit();
      }
      c.setAutoCommit(true);
      try (Statement s = c.createStatement()) {
        s.execute("set application_name = 'jdbc-check'");
        try (ResultSet r = s.executeQuery("show application_name")) { r.next(); check(r.getString(1).equals("jdbc-check"), "SET"); }
        // pgJDBC sends its SETs (its own start-up ones too) through the extended protocol:
        // they follow the session to the other shard rather than pin it to this one.
        s.execute("set pgtenant.tenant_id = 7");
        try (ResultSet r = s.executeQuery("select shard_id, current_setting('application_name') from pgtenant_shard")) {
          r.next();
          check(r.getInt(1) == 1 && r.getString(2).equals("jdbc-check"), "tenant 7 on shard 1 with the session's SET");
        }
        s.execute("set pgtenant.tenant_id = 1500");
        // Outside autocommit, pgJDBC sends BEGIN and the SET in one request.
        c.setAutoCommit(false);
        s.execute("set pgtenant.tenant_id = 7");
        try (ResultSet r = s.executeQuery("select shard_id from pgtenant_shard")) {
          r.next();
          check(r.getInt(1) == 1, "SET first in a transaction");
        }
        c.commit();
        s.execute("set pgtenant.tenant_id = 1500");
        c.commit();
        c.setAutoCommit(true);
      }
      try (Statement s = c.createStatement()) {
        s.execute("delete from jdbc_t");
        org.postgresql.copy.CopyManager copy = ((org.postgresql.PGConnection) c).getCopyAPI();
        long in = copy.copyIn("copy jdbc_t from stdin (format csv)", new java.io.StringReader("1500,a\n1500,\"b,c\"\n"));
        java.io.StringWriter out = new java.io.StringWriter();
        copy.copyOut("copy (select v from jdbc_t order by v) to stdout", out);
        check(in == 2 && out.toString().equals("a\nb,c\n"), "COPY in and out: " + out);
        c.setAutoCommit(false); // a fetch size needs a transaction: a portal read in parts
        s.setFetchSize(7);
        int rows = 0;
        try (ResultSet r = s.executeQuery("select generate_series(1, 100)")) { while (r.next()) rows++; }
        c.commit();
        c.setAutoCommit(true);
        check(rows == 100, "fetch size cursor: " + rows);
        new Thread(() -> { try { Thread.sleep(500); s.cancel(); } catch (Exception e) { } }).start();
        try {
          s.execute("select pg_sleep(10)");
          throw new AssertionError("pg_sleep was not cancelled");
        } catch (SQLException e) {
          check("57014".equals(e.getSQLState()), "cancel: " + e.getSQLState());
        }
      }
      // A batch of 100,000 rows, in autocommit and in a transaction (issue 57, item 2).
      try (Statement s = c.createStatement()) { s.execute("drop table if exists jdbc_bulk; create table jdbc_bulk (tenant_id bigint, v int)"); }
      for (boolean autocommit : new boolean[] { true, false }) {
        c.setAutoCommit(autocommit);
        try (PreparedStatement ps = c.prepareStatement("insert into jdbc_bulk values (1500, ?)")) {
          for (int i = 0; i < 100_000; i++) { ps.setInt(1, i); ps.addBatch(); }
          ps.executeBatch();
        }
        if (!autocommit) c.commit();
      }
      c.setAutoCommit(true);
      try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("select count(*) from jdbc_bulk")) {
        r.next();
        check(r.getLong(1) == 200_000, "batch rows: " + r.getLong(1));
        s.execute("drop table jdbc_bulk");
      }
      // Snowflake IDs answered by pgtenant, also once pgJDBC prepares on the "server".
      long last = 0;
      try (PreparedStatement ps = c.prepareStatement("select pgtenant.next_id(?)")) {
        for (int i = 0; i < 4; i++) {
          ps.setLong(1, 3 + i);
          try (ResultSet r = ps.executeQuery()) {
            r.next();
            long id = r.getLong(1);
            check(((id >> 12) & 1023) == 3 + i, "snowflake shard id");
            check(id > last, "ascending snowflake IDs");
            last = id;
          }
        }
      }
    }
    try {
      DriverManager.getConnection(url + "?user=app&password=bad&sslmode=disable");
      throw new AssertionError("bad password accepted");
    } catch (SQLException e) {
      check("28P01".equals(e.getSQLState()), "28P01, got " + e.getSQLState());
    }
    System.out.println("pgjdbc ok");
  }
}
