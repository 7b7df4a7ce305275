use clap::Parser;
use pgtenant::cli::{Cli, Command};
use pgtenant::config::{Config, LogFormat};

// mimalloc rather than glibc's malloc: in `bench/soak.sh` (10,000 idle clients that come
// and go, statement load, server restarts) glibc's RSS crept up for the whole hour
// (+20 MB in the first 12 minutes) through fragmentation, while mimalloc's stayed
// within 5 MB of its level (about 2 KiB more per idle client to start with).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        pgtenant::observe::init_logging("info");
    }
    match cli.command {
        Command::CheckConfig { file } => match Config::load(&file) {
            Ok(_) => {
                println!("{}: ok", file.display());
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::ExitCode::FAILURE
            }
        },
        Command::Serve { config: file } => {
            let config = match Config::load(&file) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            pgtenant::observe::init_logging_as("info", config.observe.log_format == LogFormat::Json);
            run(config.proxy.workers, config.proxy.thread_per_core, async move {
                let proxy =
                    pgtenant::server::start_with_file(config, Some(file)).await.map_err(|e| e.to_string())?;
                proxy.serve_until_signal().await;
                Ok(())
            })
        }
        Command::Probe { url } => {
            match pgtenant::observe::http::probe(&url, std::time::Duration::from_secs(3)) {
                Ok(status) if (200..300).contains(&status) => std::process::ExitCode::SUCCESS,
                Ok(status) => {
                    eprintln!("{url}: HTTP {status}");
                    std::process::ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("{url}: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Dev(options) => run(options.workers, options.thread_per_core, pgtenant::dev::run(options)),
    }
}

/// Runs `job` on a runtime of `workers` threads (0: automatic, see
/// `config::resolve_workers`; 1: a single-threaded runtime), or, when clients have
/// threads of their own (`thread_per_core`), on a single-threaded runtime that serves
/// the control plane alone.
fn run(
    workers: usize,
    thread_per_core: bool,
    job: impl Future<Output = Result<(), String>>,
) -> std::process::ExitCode {
    let workers = if thread_per_core { 1 } else { pgtenant::config::resolve_workers(workers) };
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if workers > 1 {
        builder.worker_threads(workers);
    }
    let runtime = builder.enable_all().build().expect("tokio runtime");
    match runtime.block_on(job) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgtenant: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
