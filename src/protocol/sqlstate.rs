//! SQLSTATE codes pgtenant raises itself, by their PostgreSQL names.

pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CONNECTION_FAILURE: &str = "08006";
pub const UNABLE_TO_CONNECT: &str = "08001";
pub const INVALID_PASSWORD: &str = "28P01";
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const ADMIN_SHUTDOWN: &str = "57P01";
pub const CANNOT_CONNECT_NOW: &str = "57P03";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const INVALID_PARAMETER_VALUE: &str = "22023";
pub const UNDEFINED_OBJECT: &str = "42704";
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
pub const RESERVED_NAME: &str = "42939";
pub const ACTIVE_SQL_TRANSACTION: &str = "25001";
pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "25P03";
pub const IDLE_SESSION_TIMEOUT: &str = "57P05";
/// PostgreSQL 17's `transaction_timeout`.
pub const TRANSACTION_TIMEOUT: &str = "25P04";
pub const NULL_VALUE_NOT_ALLOWED: &str = "22004";
pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
pub const OBJECT_IN_USE: &str = "55006";
pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
pub const OUT_OF_MEMORY: &str = "53200";
pub const SYNTAX_ERROR: &str = "42601";
pub const QUERY_CANCELED: &str = "57014";
pub const WARNING: &str = "01000";
pub const CONFIG_FILE_ERROR: &str = "F0000";
pub const CRASH_SHUTDOWN: &str = "57P02";
pub const INTERNAL_ERROR: &str = "XX000";
// Those the fuzz targets' fake server answers with, as PostgreSQL does.
pub const DUPLICATE_PSTATEMENT: &str = "42P05";
pub const DUPLICATE_CURSOR: &str = "42P03";
pub const INVALID_CURSOR_NAME: &str = "34000";
pub const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
pub const CONFIGURATION_LIMIT_EXCEEDED: &str = "53400";
