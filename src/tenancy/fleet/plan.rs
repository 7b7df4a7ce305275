//! Which tenants a fleet command moves where: a pure function of the shards (status,
//! capacity, the tenants each holds and their load), unit-tested alone.
//!
//! Load is what pgtenant counted for each tenant (its transactions, `observe::tenants`)
//! plus one per tenant, so that tenants it has not seen count too. A shard's fill is
//! its load over its capacity. The rules:
//!
//! - DRAIN SHARD n: every tenant of n, heaviest first, to the active shard (not n) whose
//!   fill is lowest after taking it.
//! - REBALANCE [SHARDS a, b, ...]: among those shards (all active ones by default),
//!   repeatedly the heaviest tenant of the fullest shard that, moved to the emptiest,
//!   lowers the higher of the two fills. A move costs a copy and a pause, so only
//!   tenants carrying at least `MIN_SHARE` of the mean shard load move (a crowd of
//!   light tenants is not moved to shave a few percent), and it stops once the fullest
//!   shard's fill is within `TOLERANCE` of the mean, or when no such move lowers it.
//!   At most `MAX_STEPS` moves per plan.
//! - ISOLATE TENANT t [TO SHARD n]: t to n, which must hold no tenant, or to the first
//!   active shard that holds none (a spare).

use crate::directory::ShardId;

/// Moves one plan makes at most (a REBALANCE of a very uneven fleet is run in rounds).
pub const MAX_STEPS: usize = 1000;

/// REBALANCE is done once the fullest shard is at most this far above the mean fill.
pub const TOLERANCE: f64 = 0.10;

/// REBALANCE moves no tenant lighter than this share of the mean shard load.
pub const MIN_SHARE: f64 = 0.01;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardStatus {
    Active,
    /// Routed, but takes no new tenants: never a target.
    Draining,
    Disabled,
}

#[derive(Clone, Debug)]
pub struct ShardLoad {
    pub id: ShardId,
    pub status: ShardStatus,
    /// Tenants it is meant to hold (the catalog's `capacity`), at least 1.
    pub capacity: u64,
    /// Its tenants and their loads.
    pub tenants: Vec<(i64, u64)>,
}

impl ShardLoad {
    fn load(&self) -> u64 {
        self.tenants.iter().map(|(_, l)| l).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub tenant: i64,
    pub source: ShardId,
    pub target: ShardId,
    /// The tenant's load, as planned with.
    pub load: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("shard {0} is not known")]
    UnknownShard(ShardId),
    #[error("no active shard other than {0} can take its tenants")]
    NoTarget(ShardId),
    #[error("tenant {0} holds no rows on any shard the plan reads")]
    UnknownTenant(i64),
    #[error("shard {shard} holds {tenants} tenant(s); a tenant is isolated on a shard that holds none")]
    NotEmpty { shard: ShardId, tenants: usize },
    #[error("no active shard holds no tenant: add one (a spare) or name one with TO SHARD")]
    NoSpare,
    #[error("tenant {tenant} is on shard {shard} already")]
    AlreadyThere { tenant: i64, shard: ShardId },
}

/// Fill of a shard with `load` and `capacity`, comparable across shards.
fn fill(load: u64, capacity: u64) -> f64 {
    load as f64 / capacity.max(1) as f64
}

pub fn drain(shards: &[ShardLoad], from: ShardId) -> Result<Vec<Step>, PlanError> {
    let source = shards.iter().find(|s| s.id == from).ok_or(PlanError::UnknownShard(from))?;
    let mut targets: Vec<(ShardId, u64, u64)> = shards
        .iter()
        .filter(|s| s.id != from && s.status == ShardStatus::Active)
        .map(|s| (s.id, s.load(), s.capacity))
        .collect();
    if targets.is_empty() && !source.tenants.is_empty() {
        return Err(PlanError::NoTarget(from));
    }
    let mut tenants = source.tenants.clone();
    tenants.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut steps = Vec::with_capacity(tenants.len());
    for (tenant, load) in tenants {
        let best = targets
            .iter_mut()
            .min_by(|a, b| fill(a.1 + load, a.2).total_cmp(&fill(b.1 + load, b.2)).then(a.0.cmp(&b.0)))
            .ok_or(PlanError::NoTarget(from))?;
        best.1 += load;
        steps.push(Step { tenant, source: from, target: best.0, load });
    }
    Ok(steps)
}

pub fn rebalance(shards: &[ShardLoad], among: Option<&[ShardId]>) -> Result<Vec<Step>, PlanError> {
    if let Some(ids) = among {
        for id in ids {
            if !shards.iter().any(|s| s.id == *id) {
                return Err(PlanError::UnknownShard(*id));
            }
        }
    }
    let mut pool: Vec<ShardLoad> = shards
        .iter()
        .filter(|s| s.status == ShardStatus::Active && among.is_none_or(|ids| ids.contains(&s.id)))
        .cloned()
        .collect();
    let mut steps = Vec::new();
    let total: u64 = pool.iter().map(ShardLoad::load).sum();
    let capacity: u64 = pool.iter().map(|s| s.capacity.max(1)).sum();
    let good_enough = fill(total, capacity) * (1.0 + TOLERANCE);
    let lightest_worth_moving = (total as f64 / pool.len().max(1) as f64 * MIN_SHARE).ceil() as u64;
    while steps.len() < MAX_STEPS && pool.len() >= 2 {
        let by_fill = |s: &ShardLoad| fill(s.load(), s.capacity);
        let hot =
            (0..pool.len()).max_by(|&a, &b| by_fill(&pool[a]).total_cmp(&by_fill(&pool[b])).then(b.cmp(&a)));
        let cold =
            (0..pool.len()).min_by(|&a, &b| by_fill(&pool[a]).total_cmp(&by_fill(&pool[b])).then(a.cmp(&b)));
        let (Some(hot), Some(cold)) = (hot, cold) else { break };
        if hot == cold {
            break;
        }
        let (hot_load, cold_load) = (pool[hot].load(), pool[cold].load());
        let before = by_fill(&pool[hot]);
        if before <= good_enough {
            break;
        }
        // The heaviest tenant whose move lowers the higher fill of the two.
        let pick = pool[hot]
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, (_, l))| *l >= lightest_worth_moving)
            .filter(|(_, (_, l))| {
                let after_hot = fill(hot_load - l, pool[hot].capacity);
                let after_cold = fill(cold_load + l, pool[cold].capacity);
                after_hot.max(after_cold) < before
            })
            .max_by(|a, b| a.1.1.cmp(&b.1.1).then(b.1.0.cmp(&a.1.0)))
            .map(|(i, _)| i);
        let Some(i) = pick else { break };
        let (tenant, load) = pool[hot].tenants.remove(i);
        pool[cold].tenants.push((tenant, load));
        steps.push(Step { tenant, source: pool[hot].id, target: pool[cold].id, load });
    }
    Ok(steps)
}

/// (highest load - lowest load, the lightest tenant's load on the most loaded shard)
/// over the active shards: what a REBALANCE that found no further move leaves, and
/// its bound.
pub fn spread(shards: &[ShardLoad]) -> (u64, u64) {
    let active: Vec<&ShardLoad> = shards.iter().filter(|s| s.status == ShardStatus::Active).collect();
    let Some(hot) = active.iter().max_by_key(|s| s.load()) else { return (0, 0) };
    let low = active.iter().map(|s| s.load()).min().unwrap_or(0);
    (hot.load() - low, hot.tenants.iter().map(|(_, l)| *l).min().unwrap_or(0))
}

pub fn isolate(shards: &[ShardLoad], tenant: i64, to: Option<ShardId>) -> Result<Vec<Step>, PlanError> {
    let source = shards
        .iter()
        .find(|s| s.tenants.iter().any(|(t, _)| *t == tenant))
        .ok_or(PlanError::UnknownTenant(tenant))?;
    let load = source.tenants.iter().find(|(t, _)| *t == tenant).map_or(1, |(_, l)| *l);
    let target = match to {
        Some(id) => {
            let shard = shards.iter().find(|s| s.id == id).ok_or(PlanError::UnknownShard(id))?;
            if id == source.id {
                return Err(PlanError::AlreadyThere { tenant, shard: id });
            }
            if !shard.tenants.is_empty() {
                return Err(PlanError::NotEmpty { shard: id, tenants: shard.tenants.len() });
            }
            id
        }
        None => shards
            .iter()
            .find(|s| s.status == ShardStatus::Active && s.tenants.is_empty() && s.id != source.id)
            .map(|s| s.id)
            .ok_or(PlanError::NoSpare)?,
    };
    Ok(vec![Step { tenant, source: source.id, target, load }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: ShardId, tenants: &[(i64, u64)]) -> ShardLoad {
        ShardLoad { id, status: ShardStatus::Active, capacity: 100, tenants: tenants.to_vec() }
    }

    #[test]
    fn drain_moves_every_tenant_heaviest_first_to_the_emptiest_active_shard() {
        let mut shards = vec![shard(1, &[(1, 50), (2, 10), (3, 30)]), shard(2, &[(4, 20)]), shard(3, &[])];
        shards.push(ShardLoad { status: ShardStatus::Draining, ..shard(4, &[]) });
        let steps = drain(&shards, 1).unwrap();
        let moved: Vec<(i64, ShardId)> = steps.iter().map(|s| (s.tenant, s.target)).collect();
        assert_eq!(moved, vec![(1, 3), (3, 2), (2, 2)], "never to the draining shard 4");
        assert_eq!(drain(&[shard(1, &[(1, 1)])], 1), Err(PlanError::NoTarget(1)));
        assert_eq!(drain(&shards, 9), Err(PlanError::UnknownShard(9)));
    }

    #[test]
    fn rebalance_evens_loads_onto_a_new_empty_shard_within_the_stated_bound() {
        let shards = vec![
            shard(1, &[(1, 40), (2, 30), (3, 20), (4, 10), (5, 5)]),
            shard(2, &[(6, 30), (7, 20), (8, 5)]),
            shard(3, &[]),
        ];
        let steps = rebalance(&shards, None).unwrap();
        assert!(!steps.is_empty());
        let mut after = shards.clone();
        for step in &steps {
            let from = after.iter_mut().find(|s| s.id == step.source).unwrap();
            let i = from.tenants.iter().position(|(t, _)| *t == step.tenant).unwrap();
            let moved = from.tenants.remove(i);
            after.iter_mut().find(|s| s.id == step.target).unwrap().tenants.push(moved);
        }
        let (spread_after, bound) = spread(&after);
        assert!(spread_after <= bound, "spread {spread_after} within the bound {bound}: {after:?}");
        assert!(spread_after < spread(&shards).0);
        // Only among the shards named.
        let only = rebalance(&shards, Some(&[2, 3])).unwrap();
        assert!(only.iter().all(|s| s.source == 2 && s.target == 3), "{only:?}");
        assert_eq!(rebalance(&shards, Some(&[7])), Err(PlanError::UnknownShard(7)));
        // Even already: nothing to do.
        assert!(rebalance(&[shard(1, &[(1, 10)]), shard(2, &[(2, 10)])], None).unwrap().is_empty());
    }

    #[test]
    fn rebalance_stops_within_the_tolerance_instead_of_moving_many_light_tenants() {
        // A heavy tenant and 100 light ones per shard, a new empty shard.
        let many = |base: i64| -> Vec<(i64, u64)> {
            std::iter::once((base, 300)).chain((1..=100).map(|i| (base + i, 1))).collect()
        };
        let shards = vec![shard(1, &many(1000)), shard(2, &many(2000)), shard(3, &[])];
        let steps = rebalance(&shards, None).unwrap();
        let moved: Vec<(i64, u64)> = steps.iter().map(|s| (s.tenant, s.load)).collect();
        assert_eq!(moved, vec![(1000, 300)], "a heavy tenant moves to the new shard, no crowd of light ones");
        // Within the tolerance of the mean: done at once.
        let even = vec![shard(1, &[(1, 100), (2, 5)]), shard(2, &[(3, 100)]), shard(3, &[(4, 98)])];
        assert!(rebalance(&even, None).unwrap().is_empty());
    }

    #[test]
    fn isolate_goes_to_a_named_empty_shard_or_a_spare() {
        let shards = vec![shard(1, &[(1, 50), (2, 10)]), shard(2, &[(3, 1)]), shard(3, &[])];
        assert_eq!(
            isolate(&shards, 1, None).unwrap(),
            vec![Step { tenant: 1, source: 1, target: 3, load: 50 }]
        );
        assert_eq!(isolate(&shards, 1, Some(2)), Err(PlanError::NotEmpty { shard: 2, tenants: 1 }));
        assert_eq!(isolate(&shards, 1, Some(1)), Err(PlanError::AlreadyThere { tenant: 1, shard: 1 }));
        assert_eq!(isolate(&shards, 9, None), Err(PlanError::UnknownTenant(9)));
        assert_eq!(isolate(&shards[..2], 1, None), Err(PlanError::NoSpare));
    }
}
