//! The documentation stays true (issue 55): the configuration reference lists every
//! setting the code reads, with the code's default, and every key of the shipped
//! `config/pgtenant.toml`; the errors page lists exactly the SQLSTATEs
//! `protocol/sqlstate.rs` names; relative links in the README and docs/ resolve; and
//! the README's tour runs against `pgtenant dev` (`tests/it/cli.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A file that names every section's required settings only: what the code fills in
/// for the rest is each setting's default.
const REQUIRED_ONLY: &str = r#"
[tls]
cert = "cert.pem"
key = "key.pem"
[catalog]
host = "catalog"
user = "pgtenant"
dbname = "pgtenant_catalog"
[[users]]
name = "app"
[[shards]]
id = 1
[[shards.nodes]]
host = "db1"
port = 5432
role = "primary"
[[ranges]]
min = 1
max = 1000
shard = 1
[[tenant_map]]
tenant = 42
shard = 1
[[tenant_limits]]
tenant = 42
"#;

/// Every setting as the code has it: section -> key -> default as JSON text, or
/// "(required)" for those `REQUIRED_ONLY` had to name.
fn settings_in_code() -> BTreeMap<String, BTreeMap<String, String>> {
    let config = pgtenant::config::Config::from_toml(REQUIRED_ONLY, Path::new("required-only.toml")).unwrap();
    let value = serde_json::to_value(&config).unwrap();
    let required: toml::Table = toml::from_str(REQUIRED_ONLY).unwrap();
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut add = |section: String,
                   object: &serde_json::Map<String, serde_json::Value>,
                   required: Option<&toml::Table>| {
        let entry = out.entry(section).or_default();
        for (key, v) in object {
            if v.is_array() && v.as_array().is_some_and(|a| a.first().is_some_and(|x| x.is_object())) {
                continue; // a table array of its own (shards.nodes)
            }
            let default = if required.is_some_and(|r| r.contains_key(key)) {
                "(required)".to_string()
            } else if v.is_null() {
                "(none)".to_string()
            } else {
                v.to_string()
            };
            entry.insert(key.clone(), default);
        }
    };
    for (section, v) in value.as_object().unwrap() {
        let req = required.get(section);
        match v {
            serde_json::Value::Object(o) => add(format!("[{section}]"), o, req.and_then(|r| r.as_table())),
            serde_json::Value::Array(items) => {
                let first = items[0].as_object().unwrap();
                let req_first = req.and_then(|r| r.as_array()).and_then(|a| a[0].as_table());
                add(format!("[[{section}]]"), first, req_first);
                if let Some(serde_json::Value::Array(nodes)) = first.get("nodes") {
                    let req_nodes = req_first
                        .and_then(|r| r.get("nodes"))
                        .and_then(|n| n.as_array())
                        .and_then(|a| a[0].as_table());
                    add(format!("[[{section}.nodes]]"), nodes[0].as_object().unwrap(), req_nodes);
                }
            }
            other => panic!("{section}: {other}"),
        }
    }
    out
}

/// The reference's rows: section (its `## ` heading) -> key -> default cell.
fn settings_in_reference() -> BTreeMap<String, BTreeMap<String, String>> {
    let text = read("docs/configuration.md");
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = None;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading.split_whitespace().next().filter(|h| h.starts_with('[')).map(str::to_string);
            continue;
        }
        let (Some(section), Some(row)) = (&section, line.strip_prefix("| `")) else { continue };
        let cells: Vec<&str> = row.split(" | ").collect();
        let key = cells[0].trim_end_matches('`');
        let default = cells.get(2).map(|c| c.trim().trim_matches('`')).unwrap_or_default();
        out.entry(section.clone()).or_default().insert(key.to_string(), default.to_string());
    }
    out
}

#[test]
fn the_configuration_reference_lists_every_setting_with_the_code_s_default() {
    let code = settings_in_code();
    let reference = settings_in_reference();
    let mut problems = Vec::new();
    for (section, keys) in &code {
        for (key, default) in keys {
            match reference.get(section).and_then(|s| s.get(key)) {
                None => problems.push(format!("missing: {section} | `{key}` | ? | `{default}` |")),
                Some(documented) if documented != default => problems
                    .push(format!("{section} {key}: documented default {documented}, the code's {default}")),
                Some(_) => {}
            }
        }
    }
    for (section, keys) in &reference {
        for key in keys.keys() {
            if !code.get(section).is_some_and(|s| s.contains_key(key)) {
                problems.push(format!("documented but not in the code: {section} {key}"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/configuration.md:\n{}", problems.join("\n"));
}

#[test]
fn every_key_of_the_shipped_configuration_is_in_the_reference() {
    let shipped: toml::Table = toml::from_str(&read("config/pgtenant.toml")).unwrap();
    let reference = settings_in_reference();
    let mut missing = Vec::new();
    for (section, value) in &shipped {
        let tables: Vec<(String, &toml::Table)> = match value {
            toml::Value::Table(t) => vec![(format!("[{section}]"), t)],
            toml::Value::Array(items) => {
                items.iter().filter_map(|i| i.as_table()).map(|t| (format!("[[{section}]]"), t)).collect()
            }
            _ => {
                missing.push(format!("top-level key {section}"));
                continue;
            }
        };
        for (name, table) in tables {
            for (key, v) in table {
                if key == "nodes" {
                    for node in v.as_array().into_iter().flatten().filter_map(|n| n.as_table()) {
                        for k in node.keys() {
                            if !reference
                                .get(&format!("[[{section}.nodes]]"))
                                .is_some_and(|s| s.contains_key(k))
                            {
                                missing.push(format!("[[{section}.nodes]] {k}"));
                            }
                        }
                    }
                } else if !reference.get(&name).is_some_and(|s| s.contains_key(key)) {
                    missing.push(format!("{name} {key}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "config/pgtenant.toml keys not in docs/configuration.md: {missing:?}");
}

/// The SQLSTATEs of a checked table of docs/errors.md (between its markers).
fn codes_on_errors_page() -> BTreeSet<String> {
    let text = read("docs/errors.md");
    let start = text.find("<!-- sqlstate-table: raised -->").expect("start marker");
    let end = text.find("<!-- sqlstate-table: end -->").expect("end marker");
    text[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" | ").next())
        .filter(|c| c.len() == 5 && c.chars().all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit()))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_errors_page_lists_exactly_the_sqlstates_pgtenant_names() {
    let source = read("src/protocol/sqlstate.rs");
    let named: BTreeSet<String> = source
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_string)
        .collect();
    assert!(named.len() > 20, "{named:?}");
    let listed = codes_on_errors_page();
    let unlisted: Vec<_> = named.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&named).collect();
    assert!(unlisted.is_empty(), "named in sqlstate.rs, not on docs/errors.md: {unlisted:?}");
    assert!(unknown.is_empty(), "on docs/errors.md, not in sqlstate.rs: {unknown:?}");
}

#[test]
fn relative_links_in_the_readme_and_docs_resolve() {
    let mut pages = vec![root().join("README.md")];
    pages.extend(std::fs::read_dir(root().join("docs")).unwrap().map(|e| e.unwrap().path()));
    let mut broken = Vec::new();
    for page in pages.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let text = std::fs::read_to_string(page).unwrap();
        for (at, _) in text.match_indices("](") {
            let target: String = text[at + 2..].chars().take_while(|c| *c != ')').collect();
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) =
                target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = page.parent().unwrap().join(path);
            if !file.exists() {
                broken.push(format!("{}: {target}", page.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && file.extension().is_some_and(|e| e == "md")
            {
                let headings: Vec<String> = std::fs::read_to_string(&file)
                    .unwrap()
                    .lines()
                    .filter_map(|l| {
                        l.trim_start_matches('#').strip_prefix(' ').filter(|_| l.starts_with('#'))
                    })
                    .map(anchor_of)
                    .collect();
                if !headings.iter().any(|h| h == anchor) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, punctuation dropped.
fn anchor_of(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The README's tour: its command lines (each followed, where it says, by `#=> text`,
/// which its output must contain), between the `<!-- tour -->` markers.
fn tour() -> Vec<(String, Option<String>)> {
    let readme = read("README.md");
    let start = readme.find("<!-- tour -->").expect("tour marker");
    let end = readme.find("<!-- end tour -->").expect("end of the tour");
    let mut steps: Vec<(String, Option<String>)> = Vec::new();
    for line in readme[start..end].lines() {
        if let Some(expected) = line.strip_prefix("#=> ") {
            steps.last_mut().expect("an expectation follows a command").1 = Some(expected.to_string());
        } else if !line.is_empty()
            && !line.starts_with('#')
            && !line.starts_with("```")
            && !line.starts_with("<!--")
        {
            steps.push((line.to_string(), None));
        }
    }
    steps
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_tour_runs_against_pgtenant_dev() {
    use crate::harness::{DEV_CLUSTERS, DevProcess, free_port_run, stop_dev, wait_serving};
    let steps = tour();
    assert!(steps.len() >= 10, "{steps:?}");
    let dir = crate::harness::clusters::base_dir().join("tour");
    let _ = std::fs::remove_dir_all(&dir);
    let (port, shard_port, http_port) = (
        crate::harness::clusters::free_port(),
        free_port_run(DEV_CLUSTERS),
        crate::harness::clusters::free_port(),
    );
    let mut dev = DevProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_pgtenant"))
            .args(["dev", "--port", &port.to_string(), "--shard-port", &shard_port.to_string()])
            .args(["--http-port", &http_port.to_string(), "--dir"])
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_serving(port, std::time::Instant::now()).await;
    // The README's ports and directory are dev's defaults; this run's are its own.
    let mut substitutions = vec![("port=6432".to_string(), format!("port={port}"))];
    for i in 0..DEV_CLUSTERS {
        substitutions.push((format!("port={}", 6442 + i), format!("port={}", shard_port + i)));
    }
    substitutions.push((".pgtenant-dev/".into(), format!("{}/", dir.display())));
    for (command, expected) in steps {
        let mut line = command.clone();
        for (from, to) in &substitutions {
            line = line.replace(from, to);
        }
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("timeout").args(["120", "bash", "-c", &line]).output().unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{command}\n{}{stdout}", String::from_utf8_lossy(&out.stderr));
        if let Some(expected) = expected {
            assert!(stdout.contains(&expected), "{command}: expected {expected:?} in\n{stdout}");
        }
    }
    stop_dev(&mut dev.0);
}
