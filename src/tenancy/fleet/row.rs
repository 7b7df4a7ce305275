//! A fleet batch as the catalog has it (`fleet_batch` with its steps' totals): what
//! SHOW BATCHES answers and what `/metrics` reports of the batches a proxy drives (the
//! move service keeps the last one its driver read, hence a file that imports nothing).

#[derive(Clone, Debug)]
pub struct BatchRow {
    pub id: i64,
    pub command: String,
    pub dbname: String,
    pub state: String,
    pub parallel: i32,
    pub driver: Option<String>,
    pub error: Option<String>,
    pub created_at: String,
    pub ended_at: Option<String>,
    /// Steps in all, done, failed; the longest pause of a tenant of its moves (ms).
    pub steps: i64,
    pub done: i64,
    pub failed: i64,
    pub longest_pause_ms: Option<i64>,
    /// Rows its moves copied and their size, and how long it ran (so far).
    pub rows_copied: i64,
    pub bytes_copied: i64,
    pub seconds: f64,
    /// The copy-bandwidth budget, bytes a second (`None`: none).
    pub bandwidth: Option<i64>,
}
