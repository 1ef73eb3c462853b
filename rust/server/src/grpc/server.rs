//! Serving the `VllmEngine` service on the adopted `--grpc-listen-fd` socket.

use super::service::Servicer;
use crate::http::state::AppState;
use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use vllm_rs_config::error::ExitError;
use vllm_rs_engine::fds::{adopt_listening_socket, ListeningSocket, LocalAddress};
use vllm_rs_engine::EngineClient;
use vllm_rs_grpc::engine::vllm_engine_server::VllmEngineServer;

/// Adopts the `--grpc-listen-fd` socket, which must be TCP (gRPC clients dial host:port).
pub fn adopt(fd: std::os::fd::RawFd) -> Result<ListeningSocket, ExitError> {
    let socket = adopt_listening_socket(fd, "grpc-listen-fd")?;
    match socket.address {
        LocalAddress::Tcp(_) => Ok(socket),
        _ => Err(ExitError::usage(format!("--grpc-listen-fd {fd}: not a TCP socket"))),
    }
}

/// Serves gRPC on `socket` until `stopping` resolves, then lets running calls finish.
pub async fn serve(
    socket: ListeningSocket,
    state: Arc<AppState>,
    stopping: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::from(socket.fd);
    listener.set_nonblocking(true).context("adopting the gRPC socket")?;
    let listener = tokio::net::TcpListener::from_std(listener).context("adopting the gRPC socket")?;
    if let LocalAddress::Tcp(address) = socket.address {
        tracing::info!("serving vLLM's gRPC API on {address}");
    }
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    // Clients ask either version of the reflection protocol (grpcurl v1 first, vLLM serves v1alpha).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(vllm_rs_grpc::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().context("building the gRPC reflection service")?;
    let reflection_v1alpha = reflection().build_v1alpha().context("building the gRPC reflection service")?;
    tonic::transport::Server::builder()
        .add_service(health_service(state.engines.clone()).await)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(VllmEngineServer::new(Servicer::new(state)))
        .serve_with_incoming_shutdown(incoming, stopping)
        .await
        .context("serving gRPC")
}

/// The standard `grpc.health.v1.Health` service: the server (`""`) and
/// `vllm.grpc.engine.VllmEngine` are SERVING until the engines fail, then
/// NOT_SERVING; other names are unknown (NOT_FOUND).
async fn health_service(engines: EngineClient) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    let healthy = engines.failure().is_none();
    set_health(&reporter, if healthy { ServingStatus::Serving } else { ServingStatus::NotServing }).await;
    tokio::spawn(async move {
        engines.failed().await;
        set_health(&reporter, ServingStatus::NotServing).await;
    });
    service
}

async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for name in ["", vllm_rs_grpc::SERVICE_NAME] {
        reporter.set_service_status(name, status).await;
    }
}

/// Waits up to `timeout` for the gRPC server to finish its running calls;
/// false when some are still running (the caller then aborts them).
pub async fn drained(server: JoinHandle<anyhow::Result<()>>, timeout: Duration) -> bool {
    match tokio::time::timeout(timeout, server).await {
        Ok(Ok(Ok(()))) => true,
        Ok(Ok(Err(e))) => {
            tracing::error!("gRPC server failed: {e:#}");
            true
        }
        Ok(Err(e)) => {
            tracing::error!("gRPC server task failed: {e}");
            true
        }
        Err(_) => false,
    }
}
