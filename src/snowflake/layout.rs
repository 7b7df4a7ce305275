//! The bit layout of an ID (`seeds/003_…`): 41 bits of milliseconds since
//! 2024-01-01 00:00:00 UTC, 10 bits of shard id, 12 bits of sequence. The sequence
//! is split into an instance number (high bits) and a per-millisecond counter (low
//! bits), so that several minters of one shard never produce the same ID.

/// 2024-01-01 00:00:00 UTC in Unix milliseconds.
pub const EPOCH_UNIX_MS: i64 = 1_704_067_200_000;
pub const TIMESTAMP_BITS: u32 = 41;
pub const SHARD_BITS: u32 = 10;
pub const SEQUENCE_BITS: u32 = 12;
pub const MAX_SHARD: i64 = (1 << SHARD_BITS) - 1;
/// The last millisecond (since the epoch) an ID can carry.
pub const MAX_TIMESTAMP_MS: i64 = (1 << TIMESTAMP_BITS) - 1;

/// How the 12 sequence bits are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    instance_bits: u32,
}

/// An ID taken apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Unix milliseconds.
    pub unix_ms: i64,
    pub shard: i64,
    pub instance: i64,
    pub counter: i64,
}

impl Layout {
    /// `instance_bits` of the 12 sequence bits number the minters (1..=11).
    pub fn new(instance_bits: u32) -> Option<Self> {
        (1..SEQUENCE_BITS).contains(&instance_bits).then_some(Self { instance_bits })
    }

    pub fn instance_bits(self) -> u32 {
        self.instance_bits
    }

    pub fn counter_bits(self) -> u32 {
        SEQUENCE_BITS - self.instance_bits
    }

    /// The highest instance number; 0 is the servers' own SQL function.
    pub fn max_instance(self) -> i64 {
        (1 << self.instance_bits) - 1
    }

    /// IDs one minter can produce per millisecond and shard.
    pub fn ids_per_ms(self) -> i64 {
        1 << self.counter_bits()
    }

    /// The ID for `ms` (since the epoch); every part must be in range (callers check).
    pub fn compose(self, ms: i64, shard: i64, instance: i64, counter: i64) -> i64 {
        debug_assert!((0..=MAX_TIMESTAMP_MS).contains(&ms));
        debug_assert!((0..=MAX_SHARD).contains(&shard));
        debug_assert!((0..=self.max_instance()).contains(&instance));
        debug_assert!((0..self.ids_per_ms()).contains(&counter));
        (ms << (SHARD_BITS + SEQUENCE_BITS))
            | (shard << SEQUENCE_BITS)
            | (instance << self.counter_bits())
            | counter
    }

    /// Takes any 64-bit value apart (a negative one has its sign bit in the timestamp).
    pub fn decode(self, id: i64) -> Decoded {
        let bits = id as u64;
        let ms = (bits >> (SHARD_BITS + SEQUENCE_BITS)) as i64;
        let shard = ((bits >> SEQUENCE_BITS) & MAX_SHARD as u64) as i64;
        let sequence = (bits & ((1 << SEQUENCE_BITS) - 1)) as i64;
        Decoded {
            unix_ms: ms + EPOCH_UNIX_MS,
            shard,
            instance: sequence >> self.counter_bits(),
            counter: sequence & (self.ids_per_ms() - 1),
        }
    }
}

impl Default for Layout {
    /// 4 + 8 bits: 15 minters (and the servers' instance 0), 256 IDs per ms each.
    fn default() -> Self {
        Self { instance_bits: 4 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_and_decode_round_trip_at_the_edges() {
        for bits in 1..SEQUENCE_BITS {
            let l = Layout::new(bits).unwrap();
            for (ms, shard, instance, counter) in [
                (0, 0, 0, 0),
                (MAX_TIMESTAMP_MS, MAX_SHARD, l.max_instance(), l.ids_per_ms() - 1),
                (86_400_000 * 365, 7, l.max_instance() / 2, l.ids_per_ms() / 3),
            ] {
                let id = l.compose(ms, shard, instance, counter);
                assert!(id >= 0 || ms == MAX_TIMESTAMP_MS, "only the 41st timestamp bit reaches the sign");
                let d = l.decode(id);
                assert_eq!(
                    (d.unix_ms - EPOCH_UNIX_MS, d.shard, d.instance, d.counter),
                    (ms, shard, instance, counter)
                );
            }
        }
    }

    #[test]
    fn the_seed_layout_places_the_parts_where_its_sql_does() {
        // seeds/003: (ts << 22) | ((shard & 1023) << 12) | seq
        let l = Layout::default();
        let id = l.compose(1234, 5, 3, 17);
        assert_eq!(id, (1234 << 22) | (5 << 12) | (3 << 8) | 17);
        assert_eq!(l.max_instance(), 15);
        assert_eq!(l.ids_per_ms(), 256);
        assert!(Layout::new(0).is_none() && Layout::new(12).is_none());
    }

    #[test]
    fn ids_sort_by_time_first() {
        let l = Layout::default();
        assert!(l.compose(10, MAX_SHARD, l.max_instance(), 255) < l.compose(11, 0, 0, 0));
    }
}
