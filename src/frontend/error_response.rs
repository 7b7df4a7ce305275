//! The one place that turns a `FrontendError` into an ErrorResponse: SQLSTATE and
//! message. Server ErrorResponses never pass through here; they are relayed as sent.

use bytes::BytesMut;

use super::error::FrontendError;
use crate::admin::scatter::ScatterError;
use crate::backend::{BackendError, CheckoutError};
use crate::directory::DirectoryError;
use crate::observe::errors::Raiser;
use crate::protocol::{self, Severity, sqlstate};
use crate::router::RouteError;
use crate::snowflake::SnowflakeError;

/// SQLSTATE and message for `err`.
pub fn to_error_info(err: &FrontendError) -> (String, String) {
    use FrontendError as E;
    let code = match err {
        E::Protocol(_) | E::Frame(_) | E::StartupTimeout { .. } => sqlstate::PROTOCOL_VIOLATION,
        E::AuthFailed { .. } => sqlstate::INVALID_PASSWORD,
        E::AuthSource { .. } => sqlstate::UNABLE_TO_CONNECT,
        E::TooManyClients { .. } | E::TooManyUserClients { .. } => sqlstate::TOO_MANY_CONNECTIONS,
        E::DatabaseDisabled { .. } => sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
        E::NotAdmin { .. } => sqlstate::INSUFFICIENT_PRIVILEGE,
        E::Paused(_) | E::CanceledWaiting | E::CanceledQueued => sqlstate::QUERY_CANCELED,
        // As PostgreSQL words them, without pgtenant's prefix: they are its answers.
        E::CanceledOwn => return (sqlstate::QUERY_CANCELED.into(), err.to_string()),
        E::Terminated => return (sqlstate::ADMIN_SHUTDOWN.into(), err.to_string()),
        E::Unsupported(_)
        | E::CrossShard { .. }
        | E::PinnedElsewhere { .. }
        | E::ExtendedTenantSet { .. }
        | E::TenantSetAmongMany { .. } => sqlstate::FEATURE_NOT_SUPPORTED,
        E::BadStartupParameter(_) | E::BadSettingValue { .. } => sqlstate::INVALID_PARAMETER_VALUE,
        E::ShuttingDown | E::Killed => sqlstate::ADMIN_SHUTDOWN,
        E::IdleInTransaction { .. } => sqlstate::IDLE_IN_TRANSACTION_TIMEOUT,
        E::IdleSession { .. } => sqlstate::IDLE_SESSION_TIMEOUT,
        E::TransactionTimeout { .. } => sqlstate::TRANSACTION_TIMEOUT,
        E::QueryTimeout { .. } => sqlstate::QUERY_CANCELED,
        E::ServerRefused(fields) | E::ServerGone { fatal: Some(fields), .. } => {
            return (fields.code.clone(), fields.message.clone());
        }
        E::ServerGone { fatal: None, .. } => sqlstate::CONNECTION_FAILURE,
        E::Scatter(ScatterError::Statement(fields)) => return (fields.code.clone(), fields.message.clone()),
        E::Scatter(ScatterError::Shard { fields, .. }) => fields.code.as_str(),
        E::Scatter(ScatterError::Unmergeable(_) | ScatterError::Unparsed(_) | ScatterError::RowLimit) => {
            sqlstate::FEATURE_NOT_SUPPORTED
        }
        E::Scatter(ScatterError::NotAllowed { .. } | ScatterError::TenantBound { .. }) => {
            sqlstate::INSUFFICIENT_PRIVILEGE
        }
        E::Scatter(ScatterError::NotReadOnly(_)) => sqlstate::READ_ONLY_SQL_TRANSACTION,
        E::Scatter(ScatterError::InTransaction { .. }) => sqlstate::ACTIVE_SQL_TRANSACTION,
        E::Scatter(ScatterError::Timeout { .. } | ScatterError::Canceled) => sqlstate::QUERY_CANCELED,
        E::Scatter(ScatterError::Unavailable { .. } | ScatterError::NoCoordinator { .. }) => {
            sqlstate::CONNECTION_FAILURE
        }
        E::Scatter(ScatterError::TooManyPortals { .. }) => sqlstate::PROGRAM_LIMIT_EXCEEDED,
        E::Io(_) => sqlstate::CONNECTION_FAILURE,
        E::Route(RouteError::NoTenant { .. }) => sqlstate::INVALID_PARAMETER_VALUE,
        E::Route(RouteError::Directory(
            DirectoryError::NotPlaced(_) | DirectoryError::UnknownShard { .. },
        )) => sqlstate::UNDEFINED_OBJECT,
        E::Route(RouteError::Directory(DirectoryError::ShardDisabled { .. })) => sqlstate::CANNOT_CONNECT_NOW,
        E::Route(RouteError::Directory(DirectoryError::CatalogUnavailable { .. })) => {
            sqlstate::UNABLE_TO_CONNECT
        }
        E::Route(RouteError::NoDefaultShard) => sqlstate::UNDEFINED_OBJECT,
        E::Route(RouteError::CrossShard { .. }) => sqlstate::FEATURE_NOT_SUPPORTED,
        E::TenantGucProtected { .. }
        | E::SettingProtected { .. }
        | E::TenantFixed { .. }
        | E::StrictIsolation { .. }
        | E::StrictCatalog { .. }
        | E::OtherSessions { .. } => sqlstate::INSUFFICIENT_PRIVILEGE,
        E::ReservedStatementName { .. } => sqlstate::RESERVED_NAME,
        E::TenantReadOnly { .. } | E::ReadOnlyWall { .. } => sqlstate::READ_ONLY_SQL_TRANSACTION,
        E::Route(RouteError::OtherTenant { .. }) => sqlstate::INSUFFICIENT_PRIVILEGE,
        E::Checkout(CheckoutError::Exhausted { .. }) => sqlstate::TOO_MANY_CONNECTIONS,
        E::Checkout(CheckoutError::Unreachable { source: BackendError::Passthrough { .. }, .. }) => {
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION
        }
        E::Checkout(CheckoutError::Unreachable { source: BackendError::Capped { .. }, .. }) => {
            sqlstate::TOO_MANY_CONNECTIONS
        }
        E::Checkout(CheckoutError::Unreachable { .. }) => sqlstate::UNABLE_TO_CONNECT,
        E::Checkout(CheckoutError::UnknownShard { .. }) => sqlstate::UNDEFINED_OBJECT,
        E::Checkout(
            CheckoutError::Closed { .. } | CheckoutError::NoPrimary { .. } | CheckoutError::NoReplica { .. },
        ) => sqlstate::CANNOT_CONNECT_NOW,
        E::ServerLost { .. } => sqlstate::CONNECTION_FAILURE,
        E::InFailedTransaction => sqlstate::IN_FAILED_SQL_TRANSACTION,
        E::StatementNotFound { .. } => sqlstate::INVALID_SQL_STATEMENT_NAME,
        E::TooManyDeallocatePortals { .. } => sqlstate::PROGRAM_LIMIT_EXCEEDED,
        E::StatementBudget { .. } => sqlstate::OUT_OF_MEMORY,
        E::TenantChangeInTransaction { .. } => sqlstate::ACTIVE_SQL_TRANSACTION,
        E::Snowflake(
            SnowflakeError::ShardOutOfRange { .. }
            | SnowflakeError::CountOutOfRange { .. }
            | SnowflakeError::ParameterInSimpleQuery,
        ) => sqlstate::INVALID_PARAMETER_VALUE,
        E::Snowflake(SnowflakeError::NullArgument) => sqlstate::NULL_VALUE_NOT_ALLOWED,
        E::Snowflake(SnowflakeError::TooManyPortals { .. }) => sqlstate::PROGRAM_LIMIT_EXCEEDED,
        E::Snowflake(SnowflakeError::BadArgument { .. }) => sqlstate::INVALID_TEXT_REPRESENTATION,
        E::Snowflake(
            SnowflakeError::NoInstance
            | SnowflakeError::LeaseExpired { .. }
            | SnowflakeError::NoneFree
            | SnowflakeError::NotOnShard { .. }
            | SnowflakeError::ClockBackwards { .. }
            | SnowflakeError::ClockOutOfRange { .. },
        ) => sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
    };
    (code.to_string(), format!("pgtenant: {err}"))
}

/// Who raised `err`, for the error counters: PostgreSQL when pgtenant relays a
/// server's own error (a refused setup statement, a scatter-gather statement's or
/// shard's error), else pgtenant. `None` for a server's FATAL, which the server
/// connection counted as it arrived.
fn raiser(err: &FrontendError) -> Option<Raiser> {
    match err {
        FrontendError::ServerGone { fatal: Some(_), .. } => None,
        FrontendError::ServerRefused(_) => Some(Raiser::Server),
        FrontendError::Scatter(e) if e.raised_by_server() => Some(Raiser::Server),
        _ => Some(Raiser::Proxy),
    }
}

/// Appends the ErrorResponse for `err`, FATAL when the connection ends.
pub fn write_error(buf: &mut BytesMut, err: &FrontendError) {
    let (code, message) = to_error_info(err);
    if let Some(raiser) = raiser(err) {
        crate::observe::errors::count(raiser, code.as_bytes());
    }
    let severity = if err.is_fatal() { Severity::Fatal } else { Severity::Error };
    protocol::error_response(buf, severity, &code, &message);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::TenantId;

    #[test]
    fn maps_to_the_documented_codes() {
        let code = |e: FrontendError| to_error_info(&e).0;
        assert_eq!(code(FrontendError::AuthFailed { user: "a".into() }), "28P01");
        assert_eq!(
            code(FrontendError::Route(RouteError::Directory(DirectoryError::NotPlaced(TenantId::Int(9))))),
            "42704"
        );
        assert_eq!(code(FrontendError::Route(RouteError::NoTenant { param: "p".into() })), "22023");
        assert_eq!(
            code(FrontendError::Checkout(CheckoutError::Exhausted { shard: 1, size: 2, waited_ms: 3 })),
            "53300"
        );
        assert_eq!(code(FrontendError::ServerLost { shard: 1, reason: "x".into() }), "08006");
        let (_, message) = to_error_info(&FrontendError::Route(RouteError::Directory(
            DirectoryError::NotPlaced(TenantId::Int(9)),
        )));
        assert_eq!(message, "pgtenant: tenant 9 is not placed on any shard");
    }
}
