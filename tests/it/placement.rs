//! Placement of new tenants (issue 27, its first half): reservations on the fullest
//! active shard with room, through the catalog's SQL functions and the admin console.
//! Many placements at once never pass a shard's capacity nor give a tenant two shards;
//! a confirmed tenant is routed there; a cancelled or expired lease frees its place.

use std::time::Duration;

use crate::harness::{connect, new_catalog, sqlstate, start_catalog_proxy};

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_placements_fill_the_fullest_shard_first_and_never_pass_capacity() {
    let catalog = new_catalog("placement").await;
    // Shard 2 holds tenant 42 (mapped): load 1 of 4; shard 1 load 0 of 3. Room for 6.
    catalog
        .admin
        .batch_execute("UPDATE pgtenant.shard_config SET capacity = CASE shard_id WHEN 1 THEN 3 ELSE 4 END")
        .await
        .unwrap();
    let mut runs = Vec::new();
    for tenant in 5001..5021i64 {
        let conninfo = format!(
            "host={} port={} user=postgres dbname={}",
            catalog.config.host, catalog.config.port, catalog.config.dbname
        );
        runs.push(tokio::spawn(async move {
            let c = connect(&conninfo).await.unwrap();
            match c.query_one("SELECT shard_id FROM pgtenant.place_tenant($1)", &[&tenant]).await {
                Ok(row) => Ok((tenant, row.get::<_, i16>(0))),
                Err(e) => Err(sqlstate(&e)),
            }
        }));
    }
    let mut placed = Vec::new();
    for run in runs {
        match run.await.unwrap() {
            Ok(p) => placed.push(p),
            Err(code) => assert_eq!(code, "53400", "a refusal says there is no room"),
        }
    }
    assert_eq!(placed.len(), 6, "exactly the room there was: {placed:?}");
    assert_eq!(placed.iter().filter(|(_, s)| *s == 2).count(), 3);
    assert_eq!(placed.iter().filter(|(_, s)| *s == 1).count(), 3);
    let loads = catalog
        .admin
        .query(
            "SELECT shard_id, pgtenant.shard_load(shard_id), capacity FROM pgtenant.shard_config ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    for row in loads {
        assert_eq!(row.get::<_, i64>(1), i64::from(row.get::<_, i32>(2)), "full, not over");
    }
    // Fill-first: the shard that was fuller (shard 2) took the first placement.
    let first: i16 = catalog
        .admin
        .query_one(
            "SELECT shard_id FROM pgtenant.tenant_reservation ORDER BY created_at, tenant_id LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(first, 2);
    // Idempotent: placing a reserved tenant again returns its reservation.
    let (tenant, shard) = placed[0];
    let again: i16 = catalog
        .admin
        .query_one("SELECT shard_id FROM pgtenant.place_tenant($1)", &[&tenant])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, shard);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_places_confirms_and_cancels_and_routing_follows() {
    let catalog = new_catalog("placement_console").await;
    catalog.admin.batch_execute("UPDATE pgtenant.shard_config SET capacity = 1").await.unwrap();
    let proxy = start_catalog_proxy(catalog.config.clone(), |_| {}).await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    // Shard 2 is full (tenant 42); shard 1 has one place.
    let row = console.query_one("PLACE TENANT 7001", &[]).await.unwrap();
    assert_eq!(
        (row.get::<_, i64>("shard"), row.get::<_, String>("status")),
        (1, "pending".to_string()),
        "the only shard with room"
    );
    assert!(row.get::<_, Option<String>>("lease_expires_at").is_some());
    let err = console.simple_query("PLACE TENANT 7002").await.unwrap_err();
    assert_eq!(sqlstate(&err), "53400", "{err:?}");
    // Cancelled: the place is free again.
    let row = console.query_one("CANCEL TENANT 7001", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>("status"), "cancelled");
    let row = console.query_one("PLACE TENANT 7002", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>("shard"), 1);
    let row = console.query_one("CONFIRM TENANT 7002", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>("status"), "confirmed");
    // Routing follows the confirmed placement (the catalog's NOTIFY).
    let conninfo = proxy.conninfo("options='-c pgtenant.tenant_id=7002'");
    let mut shard = 0;
    for _ in 0..100 {
        if let Ok(c) = connect(&conninfo).await
            && let Ok(row) = c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await
        {
            shard = row.get::<_, i32>(0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shard, 1, "tenant 7002 is served by shard 1");
    let row = console.query_one("PLACE TENANT 7002", &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>("shard"), row.get::<_, String>("status")), (1, "confirmed".to_string()));

    // A lease that runs out frees its place; its confirmation is refused.
    catalog
        .admin
        .batch_execute("UPDATE pgtenant.shard_config SET capacity = 2 WHERE shard_id = 1")
        .await
        .unwrap();
    console.query_one("PLACE TENANT 7003 LEASE 1", &[]).await.unwrap();
    assert_eq!(sqlstate(&console.simple_query("PLACE TENANT 7004").await.unwrap_err()), "53400");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let row = console.query_one("PLACE TENANT 7004", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>("shard"), 1, "the expired lease's place");
    let err = console.simple_query("CONFIRM TENANT 7003").await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err:?}");
    // A tenant a range covers is placed already.
    let row = console.query_one("PLACE TENANT 5", &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>("shard"), row.get::<_, String>("status")), (1, "confirmed".to_string()));
    proxy.shutdown().await;
}
