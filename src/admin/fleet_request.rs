//! The console's fleet commands as words: DRAIN SHARD, REBALANCE, ISOLATE TENANT with
//! their options, SHOW PLAN, SHOW BATCHES, PAUSE / RESUME REBALANCE. `command` asks
//! here first (PAUSE REBALANCE is one of them, PAUSE SHARD is not); `fleet` runs them.

use crate::tenancy::fleet::{FleetCommand, RunOptions};

/// A fleet command as the console read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetRequest {
    /// `DRAIN SHARD n`, `REBALANCE [SHARDS a, b, ...]`, `ISOLATE TENANT id [TO SHARD n]`,
    /// each `[DATABASE name] [PARALLEL k] [BANDWIDTH n [KB|MB|GB]] [DRY RUN]`.
    Run { command: FleetCommand, database: Option<String>, options: RunOptions, dry_run: bool },
    /// `PAUSE REBALANCE [batch]`, `RESUME REBALANCE [batch]`.
    Pause { batch: Option<i64>, paused: bool },
    /// `SHOW PLAN [batch]`: a batch's steps (the newest batch's by default).
    Plan(Option<i64>),
    /// `SHOW BATCHES`.
    Batches,
}

/// A fleet command, if `words` (lower case, commas apart) are one; `Err` when they
/// start as one but do not read. A database name is returned as the words have it.
pub fn parse(words: &[&str]) -> Option<Result<FleetRequest, ()>> {
    let number = |w: &str| w.parse::<i64>().map_err(|_| ());
    let shard = |w: &str| w.parse::<u16>().map_err(|_| ());
    let optional_batch = |rest: &[&str]| match rest {
        [] => Ok(None),
        [id] => number(id).map(Some),
        _ => Err(()),
    };
    let (command, mut rest) = match words {
        ["pause" | "resume", "rebalance", rest @ ..] => {
            let paused = words[0] == "pause";
            return Some(optional_batch(rest).map(|batch| FleetRequest::Pause { batch, paused }));
        }
        ["show", "plan", rest @ ..] => return Some(optional_batch(rest).map(FleetRequest::Plan)),
        ["show", "batches"] => return Some(Ok(FleetRequest::Batches)),
        ["drain", "shard", n, rest @ ..] => (shard(n).map(|shard| FleetCommand::Drain { shard }), rest),
        ["drain", ..] => return Some(Err(())),
        ["isolate", "tenant", t, "to", "shard", n, rest @ ..] => {
            (number(t).and_then(|tenant| Ok(FleetCommand::Isolate { tenant, to: Some(shard(n)?) })), rest)
        }
        ["isolate", "tenant", t, rest @ ..] => {
            (number(t).map(|tenant| FleetCommand::Isolate { tenant, to: None }), rest)
        }
        ["isolate", ..] => return Some(Err(())),
        ["rebalance", "shards", rest @ ..] => {
            let ids: Vec<u16> = rest.iter().map_while(|w| w.parse().ok()).collect();
            let rest = &rest[ids.len()..];
            let command =
                if ids.is_empty() { Err(()) } else { Ok(FleetCommand::Rebalance { shards: Some(ids) }) };
            (command, rest)
        }
        ["rebalance", rest @ ..] => (Ok(FleetCommand::Rebalance { shards: None }), rest),
        _ => return None,
    };
    let Ok(command) = command else { return Some(Err(())) };
    let (mut database, mut options, mut dry_run) = (None, RunOptions::default(), false);
    loop {
        rest = match rest {
            ["database", name, more @ ..] => {
                database = Some(name.to_string());
                more
            }
            ["parallel", k, more @ ..] => {
                options.parallel = match k.parse() {
                    Ok(k) if k >= 1 => k,
                    _ => return Some(Err(())),
                };
                more
            }
            ["bandwidth", n, more @ ..] => {
                let (unit, more) = match more {
                    ["kb", more @ ..] => (1e3, more),
                    ["mb", more @ ..] => (1e6, more),
                    ["gb", more @ ..] => (1e9, more),
                    _ => (1e6, more),
                };
                options.bandwidth = match n.parse::<f64>() {
                    Ok(n) if n > 0.0 && (n * unit) >= 1.0 && (n * unit) < 1e15 => Some((n * unit) as u64),
                    _ => return Some(Err(())),
                };
                more
            }
            ["dry", "run", more @ ..] => {
                dry_run = true;
                more
            }
            [] => break,
            _ => return Some(Err(())),
        };
    }
    Some(Ok(FleetRequest::Run { command, database, options, dry_run }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::fleet::FleetCommand as F;

    fn read(text: &str) -> Option<Result<FleetRequest, ()>> {
        let lower = text.replace(',', " ").to_ascii_lowercase();
        let words: Vec<&str> = lower.split_whitespace().collect();
        parse(&words)
    }

    fn run(
        command: F,
        database: Option<&str>,
        parallel: u32,
        dry_run: bool,
    ) -> Option<Result<FleetRequest, ()>> {
        let options = RunOptions { parallel, ..RunOptions::default() };
        Some(Ok(FleetRequest::Run { command, database: database.map(Into::into), options, dry_run }))
    }

    #[test]
    fn reads_each_command_and_its_options() {
        let parallel = RunOptions::default().parallel;
        assert_eq!(read("DRAIN SHARD 3"), run(F::Drain { shard: 3 }, None, parallel, false));
        assert_eq!(
            read("drain shard 3 database app parallel 4 dry run"),
            run(F::Drain { shard: 3 }, Some("app"), 4, true)
        );
        assert_eq!(read("REBALANCE"), run(F::Rebalance { shards: None }, None, parallel, false));
        assert_eq!(
            read("REBALANCE SHARDS 1, 2,3 DRY RUN"),
            run(F::Rebalance { shards: Some(vec![1, 2, 3]) }, None, parallel, true)
        );
        assert_eq!(
            read("ISOLATE TENANT 42 TO SHARD 5"),
            run(F::Isolate { tenant: 42, to: Some(5) }, None, parallel, false)
        );
        assert_eq!(
            read("isolate tenant 42"),
            run(F::Isolate { tenant: 42, to: None }, None, parallel, false)
        );
        let bandwidth = |text: &str| match read(text) {
            Some(Ok(FleetRequest::Run { options, .. })) => options.bandwidth,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(bandwidth("REBALANCE BANDWIDTH 50"), Some(50_000_000));
        assert_eq!(bandwidth("rebalance bandwidth 1.5 gb parallel 3"), Some(1_500_000_000));
        assert_eq!(bandwidth("drain shard 2 bandwidth 200 KB dry run"), Some(200_000));
        assert_eq!(bandwidth("rebalance"), None);
        assert_eq!(read("PAUSE REBALANCE"), Some(Ok(FleetRequest::Pause { batch: None, paused: true })));
        assert_eq!(
            read("resume rebalance 7"),
            Some(Ok(FleetRequest::Pause { batch: Some(7), paused: false }))
        );
        assert_eq!(read("SHOW PLAN"), Some(Ok(FleetRequest::Plan(None))));
        assert_eq!(read("SHOW PLAN 2"), Some(Ok(FleetRequest::Plan(Some(2)))));
        assert_eq!(read("SHOW BATCHES"), Some(Ok(FleetRequest::Batches)));
        for bad in [
            "DRAIN 3",
            "DRAIN SHARD x",
            "REBALANCE SHARDS",
            "ISOLATE 4",
            "DRAIN SHARD 1 PARALLEL 0",
            "REBALANCE BANDWIDTH 0",
            "REBALANCE BANDWIDTH -5 MB",
            "REBALANCE BANDWIDTH lots",
            "REBALANCE now",
        ] {
            assert_eq!(read(bad), Some(Err(())), "{bad}");
        }
        // Not fleet commands: PAUSE of a shard, SHOW POOLS.
        assert_eq!(read("PAUSE SHARD 1"), None);
        assert_eq!(read("SHOW POOLS"), None);
    }
}
