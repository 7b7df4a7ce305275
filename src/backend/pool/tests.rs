//! The pools' unit tests.

use super::*;

#[tokio::test]
async fn pools_of_departed_nodes_are_closed() {
    let config = Arc::new(crate::config::test_layout());
    let directory = Arc::new(crate::directory::StaticDirectory::from_config(&config).unwrap());
    let pools = Pools::new(config.clone(), None, directory);
    let user = UserConfig {
        name: "app".into(),
        password: Some("app".into()),
        scram_secret: None,
        auth: Default::default(),
        server_user: None,
        server_password: None,
        pool_size: 2,
        pool_mode: None,
        allow_tenant_switch: None,
        target: None,
        admin: false,
        scatter_gather: false,
        see_other_sessions: false,
        max_client_connections: None,
        passthrough: None,
        catalog_login: None,
    };
    let node = |port| NodeConfig {
        host: "127.0.0.1".into(),
        port,
        role: crate::config::NodeRole::Primary,
        priority: 0,
        dbname: None,
    };
    let stays = pools.pool(1, &node(5001), &user, "app");
    let leaves = pools.pool(2, &node(5002), &user, "app");
    pools.retain_nodes(|shard, _, port, _| shard == 1 && port == 5001);
    assert!(!stays.is_closed());
    assert!(leaves.is_closed());
    let again = pools.pool(2, &node(5002), &user, "app");
    assert!(!again.is_closed(), "a node that comes back gets a new pool");
}
