//! `vllm-rs frontend` from arguments to exit: validate everything (usage
//! errors exit 2 before anything starts), adopt the sockets, wait for the
//! engines, serve HTTP, and drain on SIGTERM/SIGINT.

use crate::cli::FrontendArgs;
use crate::stats_log::log_stats_forever;
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use vllm_rs_chat::hf::{hold_table_builds, TableBuildsHold};
use vllm_rs_chat::{load_tokenizer, Tokenizer};
use vllm_rs_config::error::ExitError;
use vllm_rs_config::{process_env, ServerConfig};
use vllm_rs_coordinator::CoordinatorAddress;
use vllm_rs_engine::client::EngineSettings;
use vllm_rs_engine::coordination::follow_coordinator;
use vllm_rs_engine::fds::{adopt_listening_socket, ListeningSocket};
use vllm_rs_engine::input_socket::EngineInputSocket;
use vllm_rs_engine::listener::StreamListener;
use vllm_rs_engine::registration::wait_for_engines;
use vllm_rs_engine::sockets::{open_engine_listener, SocketSource};
use vllm_rs_engine::zmtp::FrameLimits;
use vllm_rs_engine::EngineClient;
use vllm_rs_metrics::Metrics;
use vllm_rs_model_files::class_labels::ClassLabels;
use vllm_rs_model_files::generation_config::GenerationConfig;
use vllm_rs_model_files::HubCache;
use vllm_rs_server::http::middleware::first_response::on_first_response;
use vllm_rs_server::http::server::{serve, ServeOptions};
use vllm_rs_server::http::state::{unix_now, AppState};

/// Everything the frontend needs, validated.
struct Startup {
    config: ServerConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    tokenizer: Arc<dyn Tokenizer>,
    generation_config: Arc<GenerationConfig>,
    class_labels: ClassLabels,
    http: ListeningSocket,
    grpc: Option<ListeningSocket>,
    input: SocketSource,
    output: SocketSource,
    engine_start_index: u32,
    engine_count: u32,
    coordinator: Option<CoordinatorAddress>,
    /// The tokenizer's tables are built once the frontend serves.
    tables_hold: TableBuildsHold,
}

/// Most async worker threads accepted: more only costs memory and start-up time.
const MAX_WORKER_THREADS: usize = 1024;

/// How long shutdown waits for the ABORTs of cut-off requests to reach the
/// engine sockets: a peer that stopped reading must not hold the exit.
const ABORT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Async worker threads: `TOKIO_WORKER_THREADS` when set (an integer from 1 to
/// `MAX_WORKER_THREADS`, else a usage error; tokio itself would panic on 0),
/// else one per available core: with both engine sockets in the runtime,
/// nothing else in the frontend needs one.
fn worker_threads() -> Result<usize, ExitError> {
    let bad = || ExitError::usage(format!("TOKIO_WORKER_THREADS must be an integer from 1 to {MAX_WORKER_THREADS}"));
    match std::env::var("TOKIO_WORKER_THREADS") {
        Err(std::env::VarError::NotPresent) => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_WORKER_THREADS).contains(&n) => Ok(n),
            _ => Err(ExitError::usage(format!("{}, got {value:?}", bad()))),
        },
        Err(std::env::VarError::NotUnicode(_)) => Err(bad()),
    }
}

/// Refuses one descriptor given to two flags: both would own it, and the
/// second close would hit a descriptor that is already gone (or reused).
fn check_distinct_fds(args: &FrontendArgs) -> Result<(), ExitError> {
    let given = [
        ("listen-fd", Some(args.listen_fd)),
        ("input-listener-fd", args.input_listener_fd),
        ("output-listener-fd", args.output_listener_fd),
        ("grpc-listen-fd", args.grpc_listen_fd),
    ];
    let given: Vec<(&str, i32)> = given.iter().filter_map(|&(flag, fd)| fd.map(|fd| (flag, fd))).collect();
    for (i, &(first, fd)) in given.iter().enumerate() {
        if let Some(&(second, _)) = given[i + 1..].iter().find(|&&(_, other)| other == fd) {
            return Err(ExitError::usage(format!(
                "--{first} and --{second} are the same descriptor ({fd}): each needs its own socket"
            )));
        }
    }
    Ok(())
}

/// Runs the frontend to completion.
pub fn run(args: FrontendArgs) -> Result<(), ExitError> {
    let workers = worker_threads()?;
    let startup = validate(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .thread_name("frontend")
        .build()
        .context("starting the async runtime")?;
    let outcome = runtime.block_on(run_server(startup));
    // Connection tasks may still be open: do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(200));
    outcome.map_err(ExitError::Fatal)
}

fn validate(args: FrontendArgs) -> Result<Startup, ExitError> {
    check_distinct_fds(&args)?;
    let coordinator = args
        .coordinator_address
        .as_deref()
        .map(CoordinatorAddress::parse)
        .transpose()
        .map_err(|e| ExitError::usage(format!("--coordinator-address: {e}")))?;
    if args.engine_count == 0 {
        return Err(ExitError::usage("--engine-count must be at least 1"));
    }
    if args.data_parallel_size == 0 {
        return Err(ExitError::usage("--data-parallel-size must be at least 1"));
    }
    let last_engine = u64::from(args.engine_start_index) + u64::from(args.engine_count);
    if last_engine > u64::from(args.data_parallel_size) {
        return Err(ExitError::usage(format!(
            "--engine-start-index {} with --engine-count {} exceeds --data-parallel-size {}",
            args.engine_start_index, args.engine_count, args.data_parallel_size
        )));
    }
    if last_engine > u64::from(u16::MAX) + 1 {
        return Err(ExitError::usage("--engine-count: engine indices must fit in 2 bytes"));
    }
    let config = ServerConfig::load(&args.args_json, &process_env)?;
    tracing::debug!(?config, "configuration");
    let hub = HubCache::from_env(&process_env, config.model_files.download_dir.as_deref());
    let tables_hold = hold_table_builds();
    let tokenizer = load_tokenizer(&config, &hub)?;
    let tls = config.http_layers.tls.as_ref().map(vllm_rs_server::tls::acceptor).transpose()?;
    let generation_config = Arc::new(GenerationConfig::for_server(&config, &hub)?);
    let class_labels = ClassLabels::for_server(&config, &hub)?;
    let http = adopt_listening_socket(args.listen_fd, "listen-fd")?;
    let grpc = args.grpc_listen_fd.map(vllm_rs_server::grpc::server::adopt).transpose()?;
    let source = |fd: Option<i32>, address: Option<String>, flag: &str| -> Result<SocketSource, ExitError> {
        match (fd, address) {
            (Some(fd), _) => adopt_listening_socket(fd, flag).map(SocketSource::Listener),
            (None, Some(address)) => Ok(SocketSource::Address(address)),
            (None, None) => Err(ExitError::usage(format!("--{flag} or its address flag is required"))),
        }
    };
    let input = source(args.input_listener_fd, args.input_address, "input-listener-fd")?;
    let output = source(args.output_listener_fd, args.output_address, "output-listener-fd")?;
    Ok(Startup {
        config,
        tls,
        tokenizer,
        generation_config,
        class_labels,
        http,
        grpc,
        input,
        output,
        engine_start_index: args.engine_start_index,
        engine_count: args.engine_count,
        coordinator,
        tables_hold,
    })
}

/// How long a serving frontend that has answered nothing waits before it
/// builds the tokenizer's tables anyway.
const TABLES_WITHOUT_REQUESTS: Duration = Duration::from_secs(5);

/// Ends `hold` once the frontend has its first HTTP answer ready, or after
/// [`TABLES_WITHOUT_REQUESTS`] without one; returns the hook that says so.
/// The tables are then built on their own thread, which releases the
/// start-up code once they are (main.rs); without tables to build it is
/// released here, on a worker (reading smaps and the advice take about a
/// millisecond). Until then prompts are encoded without the tables, to the
/// same ids.
///
/// Why after the first answer: building the tables takes several ms of CPU
/// and maps memory, holding the address-space lock that the page faults of
/// the first requests (code run for the first time) wait for. On a 2-core
/// host that delayed the first answer, a launcher's readiness probe, by
/// about a millisecond: spawn to the first 200 on /health went from 8.59 to
/// 7.10 ms once the build waited for it (medians of 20 alternated starts,
/// timed as `bench/bench_serve.py` times start-up;
/// docs/frontend-performance.md, "Start-up").
fn build_tables_after_first_answer(hold: TableBuildsHold) -> impl FnOnce() + Send + 'static {
    let (answered, first_answer) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(TABLES_WITHOUT_REQUESTS, first_answer).await;
        if !hold.end() {
            crate::startup_code::release();
        }
    });
    move || {
        let _ = answered.send(());
    }
}

/// A flag that turns true on the first SIGTERM or SIGINT.
fn shutdown_signal() -> anyhow::Result<watch::Receiver<bool>> {
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
        };
        tracing::info!("{name} received: shutting down");
        let _ = tx.send(true);
    });
    Ok(rx)
}

async fn run_server(startup: Startup) -> anyhow::Result<()> {
    let Startup {
        config,
        tls,
        tokenizer,
        generation_config,
        class_labels,
        http,
        grpc,
        input,
        output,
        engine_start_index: start,
        engine_count: count,
        coordinator,
        tables_hold,
    } = startup;
    let mut stop = shutdown_signal()?;
    let http_address = http.address.clone();
    let input = open_engine_listener(input, "input")?;
    let output = open_engine_listener(output, "output")?;
    let limits = FrameLimits { max_message_bytes: config.max_engine_message_bytes };
    let (input_socket, mut received) = EngineInputSocket::start(input, limits);

    tracing::info!("waiting for engines {start}..={} to register", start + count - 1);
    let registrations = tokio::select! {
        registered = wait_for_engines(&mut received, start, count, config.engine_ready_timeout) => registered?,
        _ = stop.wait_for(|stopped| *stopped) => {
            tracing::info!("stopped before every engine registered");
            return Ok(());
        }
    };
    drop(received); // later messages on the input socket are not for us
    let max_model_len = registrations.iter().filter_map(|r| r.max_model_len).chain(config.max_model_len).min();

    let settings = EngineSettings { limits, stall_timeout: config.engine_stall_timeout };
    // Without a length from the engines or the config, vLLM's default bound.
    let bucket_bound = max_model_len.unwrap_or(131_072);
    let metrics = Arc::new(Metrics::new(config.primary_model_name(), start..start + count, bucket_bound));
    let engines = EngineClient::start(input_socket, output, start, count, 0, settings, metrics.clone());
    if let Some(address) = coordinator {
        follow_coordinator(address, engines.clone());
    }
    if !config.disable_log_stats {
        tokio::spawn(log_stats_forever(metrics.clone(), engines.clone(), config.log_stats_interval));
    }
    let options = ServeOptions {
        keep_alive_timeout: config.http_timeout_keep_alive,
        header_timeout: config.http_header_timeout,
        max_header_bytes: config.http_max_header_bytes,
        max_header_count: config.http_max_header_count,
        max_connections: config.http_max_connections,
        drain_timeout: config.shutdown_timeout,
    };
    let state = Arc::new(AppState {
        config,
        tokenizer,
        generation_config,
        class_labels,
        engines: engines.clone(),
        metrics,
        max_model_len,
        created: unix_now(),
    });
    let listener = StreamListener::from_socket(http).context("adopting the HTTP socket")?;
    let scheme = if tls.is_some() { "https://" } else { "http://" };
    tracing::info!(
        "serving the OpenAI API on {} (model {}, max_model_len {:?}, engines {start}..={})",
        http_address.zmq_endpoint().replace("tcp://", scheme).replace("ipc://", "unix:"),
        state.config.primary_model_name(),
        max_model_len,
        start + count - 1
    );
    let grpc = grpc.map(|socket| {
        let mut stop = stop.clone();
        let stopping = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        tokio::spawn(vllm_rs_server::grpc::server::serve(socket, state.clone(), stopping))
    });
    let stopping = async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
        engines.stop_accepting();
    };
    let drain_timeout = options.drain_timeout;
    let routes = on_first_response(
        vllm_rs_server::http::routes::routes(state.clone()),
        build_tables_after_first_answer(tables_hold),
    );
    let mut drained = serve(listener, routes, options, tls, stopping).await;
    if let Some(grpc) = grpc {
        drained &= vllm_rs_server::grpc::server::drained(grpc, drain_timeout).await;
    }
    if !drained {
        tracing::warn!("requests still in flight after the drain timeout: aborting them");
        state.engines.abort_all("the server is shutting down");
        if tokio::time::timeout(ABORT_FLUSH_TIMEOUT, state.engines.flush()).await.is_err() {
            tracing::warn!("the ABORT messages were not all written to the engines in {ABORT_FLUSH_TIMEOUT:?}");
        }
    }
    tracing::info!("frontend stopped");
    Ok(())
}
