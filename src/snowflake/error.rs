//! Why an ID could not be minted or a call was refused.

use super::layout::MAX_SHARD;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnowflakeError {
    #[error("shard id {shard} is out of range for a snowflake ID (0..{MAX_SHARD})")]
    ShardOutOfRange { shard: i64 },
    #[error("cannot mint {n} IDs in one call (1..{max})")]
    CountOutOfRange { n: i64, max: i64 },
    #[error("no snowflake instance number yet: the lease from the catalog has not been granted")]
    NoInstance,
    #[error(
        "the lease on snowflake instance {instance} expired or was taken; minting stopped until a new lease"
    )]
    LeaseExpired { instance: i64 },
    #[error("no snowflake instance number is free (or the catalog is unreachable)")]
    NoneFree,
    /// The proxy holds no number and the shard could not mint either.
    #[error(
        "no snowflake instance number is free to this proxy, and shard {shard} could not mint instead: {reason} (install sql/snowflake.sql there, or raise [snowflake] instance_bits)"
    )]
    NotOnShard { shard: i64, reason: String },
    #[error(
        "the clock went back {behind_ms} ms, more than the {bound_ms} ms pgtenant waits out; not minting"
    )]
    ClockBackwards { behind_ms: i64, bound_ms: i64 },
    #[error("a snowflake call's argument must not be NULL")]
    NullArgument,
    /// These three concern every call pgtenant answers itself (`router::ProxyCall`).
    #[error(
        "invalid input syntax for type integer: \"{value}\" (an argument of a call pgtenant answers itself)"
    )]
    BadArgument { value: String },
    #[error("a call pgtenant answers itself with a $n parameter needs the extended protocol")]
    ParameterInSimpleQuery,
    #[error("more than {max} portals of calls pgtenant answers itself open in one session; close some")]
    TooManyPortals { max: usize },
    #[error("the clock reads {unix_ms} ms since 1970, outside what a snowflake ID can carry")]
    ClockOutOfRange { unix_ms: i64 },
}
