use super::*;

fn planned(sql: &str, names: &[&str]) -> Plan {
    let scatter = parse(sql).unwrap().expect("names all_shards");
    let facts =
        ProbeFacts { output_names: names.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    scatter.plan(&facts).unwrap()
}

fn refused(sql: &str) -> String {
    let err = match parse(sql) {
        Err(e) => e,
        Ok(Some(s)) => {
            s.plan(&ProbeFacts { output_names: vec!["x".into(); 8], ..Default::default() }).unwrap_err()
        }
        Ok(None) => panic!("{sql} names no all_shards table"),
    };
    err.to_string()
}

#[test]
fn finds_all_shards_cheaply_and_for_real() {
    assert!(mentions_all_shards(b"select 1 from ALL_SHARDS.t"));
    assert!(!mentions_all_shards(b"select all_shards_x from t"));
    assert!(parse("select 'all_shards.t' from t").unwrap().is_none());
}

#[test]
fn the_seed_query_groups_by_shard() {
    let sql = "SELECT shard_id, COUNT(*) AS session_count FROM all_shards.user_sessions \
               WHERE created_at > NOW() - INTERVAL '1 day' GROUP BY shard_id";
    let plan = planned(sql, &["shard_id", "session_count"]);
    let shard = plan.shard_sql(2);
    assert!(shard.contains("CAST(2 AS integer) AS shard_id FROM user_sessions"), "{shard}");
    assert!(shard.contains("SELECT shard_id, count(*) FROM"), "{shard}");
    assert!(shard.ends_with("GROUP BY 1"), "{shard}");
    let fin = plan.final_sql(&[23, 20]).unwrap().unwrap();
    assert_eq!(
        fin,
        "SELECT __pgtenant_c0 AS \"shard_id\", CAST(COALESCE(sum(__pgtenant_c1), 0) AS bigint) AS \"session_count\" \
         FROM pg_temp.__pgtenant_scatter GROUP BY __pgtenant_c0"
    );
}

#[test]
fn plain_rows_stream_and_need_no_shard_column() {
    let plan = planned("select id, name from all_shards.accounts a where a.id > 3", &["id", "name"]);
    assert!(matches!(plan.merge, Merge::Stream));
    assert_eq!(plan.shard_sql(1), "SELECT id, name FROM accounts AS a WHERE id > 3");
}

#[test]
fn avg_and_sum_take_their_types_from_the_partials() {
    let plan = planned("select avg(x), sum(x), min(y) from all_shards.t", &["avg", "sum", "min"]);
    assert_eq!(plan.shard_sql(1), "SELECT sum(x), count(x), sum(x), min(y) FROM t AS t");
    let fin = plan.final_sql(&[20, 20, 20, 25]).unwrap().unwrap();
    assert!(fin.contains("(CAST(sum(__pgtenant_c0) AS numeric) / sum(__pgtenant_c1)) AS \"avg\""), "{fin}");
    assert!(fin.contains("CAST(sum(__pgtenant_c2) AS bigint) AS \"sum\""), "{fin}");
    assert!(fin.contains("min(__pgtenant_c3) AS \"min\""), "{fin}");
    let fin = plan.final_sql(&[701, 20, 701, 25]).unwrap().unwrap();
    assert!(fin.contains("(sum(__pgtenant_c0) / CAST(sum(__pgtenant_c1) AS double precision))"), "{fin}");
}

#[test]
fn having_and_order_by_use_hidden_aggregates_and_never_push_limit() {
    let plan = planned(
        "select g, count(*) from all_shards.t group by g having sum(v) > 10 order by max(v) desc nulls last, 1 limit 5",
        &["g", "count"],
    );
    let shard = plan.shard_sql(1);
    assert_eq!(shard, "SELECT g, count(*), sum(v), max(v) FROM t AS t GROUP BY 1");
    let fin = plan.final_sql(&[25, 20, 20, 23]).unwrap().unwrap();
    assert!(fin.contains("HAVING CAST(sum(__pgtenant_c2) AS bigint) > 10"), "{fin}");
    assert!(fin.ends_with("ORDER BY max(__pgtenant_c3) DESC NULLS LAST, 1 LIMIT 5"), "{fin}");
}

#[test]
fn group_by_resolves_positions_and_aliases_as_postgres_does() {
    let plan = planned("select lower(s) as ls, count(*) from all_shards.t group by ls", &["ls", "count"]);
    assert!(plan.shard_sql(1).starts_with("SELECT lower(s), count(*)"), "{}", plan.shard_sql(1));
    // An input column named like the alias wins.
    let scatter = parse("select lower(s) as s, count(*) from all_shards.t group by s").unwrap().unwrap();
    assert_eq!(scatter.ambiguous_group_names, vec!["s".to_string()]);
    let mut facts = ProbeFacts { output_names: vec!["s".into(), "count".into()], ..Default::default() };
    facts.input_columns.insert("s".into());
    let plan = scatter.plan(&facts).unwrap();
    assert!(plan.shard_sql(1).starts_with("SELECT s, count(*)"), "{}", plan.shard_sql(1));
    let fin = plan.final_sql(&[25, 20]).unwrap().unwrap();
    assert!(fin.starts_with("SELECT lower(__pgtenant_c0) AS \"s\""), "{fin}");
    let plan = planned("select upper(s), count(*) from all_shards.t group by 1", &["upper", "count"]);
    assert!(plan.shard_sql(1).starts_with("SELECT upper(s), count(*)"));
}

#[test]
fn ordered_rows_push_limit_plus_offset_and_hide_extra_keys() {
    let plan = planned(
        "select id, name as n from all_shards.t order by n desc, created_at limit 10 offset $1",
        &["id", "n"],
    );
    let shard = plan.shard_sql(1);
    assert_eq!(
        shard,
        "SELECT id, name AS n, created_at FROM t AS t ORDER BY n DESC, created_at LIMIT (10) + COALESCE(($1), 0)"
    );
    let fin = plan.final_sql(&[23, 25, 1184]).unwrap().unwrap();
    assert_eq!(
        fin,
        "SELECT __pgtenant_c0 AS \"id\", __pgtenant_c1 AS \"n\" FROM pg_temp.__pgtenant_scatter \
         ORDER BY 2 DESC, __pgtenant_c2 LIMIT 10 OFFSET $1"
    );
    // DISTINCT: no pushdown.
    let plan = planned("select distinct s from all_shards.t order by s limit 3", &["s"]);
    assert_eq!(plan.shard_sql(1), "SELECT s FROM t AS t");
}

#[test]
fn distinct_aggregates_ship_their_values() {
    let plan =
        planned("select g, count(distinct u), count(*) from all_shards.t group by g", &["g", "c", "n"]);
    assert_eq!(plan.shard_sql(1), "SELECT g, u, count(*) FROM t AS t GROUP BY 1, 2");
    let fin = plan.final_sql(&[25, 23, 20]).unwrap().unwrap();
    assert!(fin.contains("count(DISTINCT __pgtenant_c1) AS \"c\""), "{fin}");
    assert!(fin.contains("GROUP BY __pgtenant_c0"), "{fin}");
}

#[test]
fn what_cannot_be_merged_is_refused_by_name() {
    assert!(refused("select a from all_shards.t join b on true").contains("join"));
    assert!(refused("select rank() over (order by a) from all_shards.t").contains("window"));
    assert!(refused("select a from all_shards.t where a in (select 1)").contains("subquery"));
    assert!(refused("select a from all_shards.t union select 1").contains("UNION"));
    assert!(refused("select g, x, count(*) from all_shards.t group by g").contains("\"x\""));
    assert!(refused("select count(distinct a), count(distinct b) from all_shards.t").contains("DISTINCT"));
    assert!(refused("select g from all_shards.t group by rollup(g)").contains("GROUP BY"));
    assert!(refused("delete from all_shards.t").contains("read-only"));
    assert!(refused("select * from all_shards.t for update").contains("read-only"));
}

#[test]
fn aggregates_the_probe_names_are_refused() {
    let scatter =
        parse("select percentile_cont(0.5) within group (order by a) from all_shards.t").unwrap().unwrap();
    assert_eq!(scatter.other_functions, vec!["percentile_cont".to_string()]);
    let mut facts = ProbeFacts { output_names: vec!["p".into()], ..Default::default() };
    facts.aggregates.insert("percentile_cont".into());
    assert!(scatter.plan(&facts).unwrap_err().to_string().contains("percentile_cont"));
}

#[test]
fn the_keyword_list_is_sorted_for_its_binary_search() {
    // `normalized` finds keywords by binary search; an unsorted entry would be missed.
    let quoted = |name: &str| normalized(&Ident::with_quote('"', name)).quote_style.is_some();
    for word in ["all", "select", "xmltable", "user", "order", "between", "json_value"] {
        assert!(quoted(word), "{word}");
    }
    for word in ["status", "shard_id", "name", "value", "a$1"] {
        assert!(!quoted(word), "{word}");
    }
    assert!(quoted("Status") && quoted("1a") && quoted("a b"));
}

#[test]
fn quoted_and_unquoted_spellings_of_a_column_are_one_column() {
    let plan = planned(
        r#"SELECT "status", count(*) FROM all_shards.t GROUP BY STATUS ORDER BY "status""#,
        &["status", "count"],
    );
    assert_eq!(plan.shard_sql(1), "SELECT status, count(*) FROM t AS t GROUP BY 1");
    let plan = planned(r#"SELECT DISTINCT "status" FROM all_shards.t ORDER BY status"#, &["status"]);
    assert!(plan.final_sql(&[25]).unwrap().unwrap().ends_with("ORDER BY 1"));
    // A quoted name with capitals is another column, kept exact.
    let plan = planned(r#"SELECT "Status" FROM all_shards.t"#, &["Status"]);
    assert_eq!(plan.shard_sql(1), r#"SELECT "Status" FROM t AS t"#);
}

#[test]
fn grouping_sets_are_refused_by_their_own_name() {
    assert!(refused("select a, count(*) from all_shards.t group by rollup (a)").contains("ROLLUP"));
    assert!(refused("select a, count(*) from all_shards.t group by cube (a)").contains("CUBE"));
    assert!(
        refused("select a, count(*) from all_shards.t group by grouping sets ((a), ())")
            .contains("GROUPING SETS")
    );
}

#[test]
fn a_table_s_own_shard_id_wins_over_the_virtual_one() {
    let sql = "SELECT shard_id, count(*) FROM all_shards.events GROUP BY shard_id";
    let mut scatter = parse(sql).unwrap().unwrap();
    assert_eq!(scatter.shard_column_question().as_deref(), Some("SELECT shard_id FROM events LIMIT 0"));
    scatter.set_own_shard_column(true);
    let facts = ProbeFacts { output_names: vec!["shard_id".into(), "count".into()], ..Default::default() };
    assert_eq!(
        scatter.plan(&facts).unwrap().shard_sql(3),
        "SELECT shard_id, count(*) FROM events AS events GROUP BY 1"
    );
    assert!(parse("SELECT id FROM all_shards.events").unwrap().unwrap().shard_column_question().is_none());
}
