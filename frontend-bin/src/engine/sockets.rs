//! The frontend's two engine-facing sockets, each adopted from an inherited
//! listener fd (never a fresh bind) or bound to a given address: the input
//! ROUTER is libzmq's (`ZMQ_USE_FD`, then `bind` to the same address); the
//! output side is a plain listener whose connections the runtime reads as a
//! ZeroMQ PULL itself (`zmtp.rs`).

use crate::fds::ListeningSocket;
use crate::listener::StreamListener;
use anyhow::{Context, Result};
use std::os::fd::IntoRawFd;

/// Where a frontend socket comes from.
#[derive(Debug)]
pub enum SocketSource {
    /// An inherited listener, adopted by libzmq.
    Listener(ListeningSocket),
    /// An address to bind (for engines started elsewhere).
    Address(String),
}

/// Opens the input socket (ROUTER). Sends to an engine that is not connected fail
/// instead of being dropped silently, and nothing queued blocks shutdown.
pub fn open_input_socket(ctx: &zmq::Context, source: SocketSource) -> Result<zmq::Socket> {
    let socket = ctx.socket(zmq::ROUTER).context("creating the input ROUTER socket")?;
    socket.set_router_mandatory(true).context("setting ZMQ_ROUTER_MANDATORY")?;
    socket.set_sndhwm(0).context("setting ZMQ_SNDHWM")?;
    socket.set_rcvhwm(0).context("setting ZMQ_RCVHWM")?;
    socket.set_linger(0).context("setting ZMQ_LINGER")?;
    attach(socket, source, "input")
}

/// Opens the output listener, where the engines' PUSH sockets connect.
pub fn open_output_listener(source: SocketSource) -> Result<StreamListener> {
    match source {
        SocketSource::Address(address) => {
            let listener = StreamListener::bind_endpoint(&address).context("opening the output socket")?;
            tracing::debug!(%address, "output socket bound");
            Ok(listener)
        }
        SocketSource::Listener(listener) => {
            let endpoint = listener.address.zmq_endpoint();
            let adopted = StreamListener::from_socket(listener).context("adopting the output listener")?;
            tracing::debug!(%endpoint, "output socket adopted its listener");
            Ok(adopted)
        }
    }
}

fn attach(mut socket: zmq::Socket, source: SocketSource, name: &str) -> Result<zmq::Socket> {
    match source {
        SocketSource::Address(address) => {
            socket.bind(&address).with_context(|| format!("binding the {name} socket to {address}"))?;
            tracing::debug!(%address, "{name} socket bound");
        }
        SocketSource::Listener(listener) => {
            let endpoint = listener.address.zmq_endpoint();
            let fd = listener.fd.into_raw_fd(); // libzmq owns it from here on
            set_use_fd(&mut socket, fd).with_context(|| format!("adopting fd {fd} for the {name} socket"))?;
            socket.bind(&endpoint).with_context(|| format!("adopting fd {fd} as {endpoint} for the {name} socket"))?;
            tracing::debug!(fd, %endpoint, "{name} socket adopted its listener");
        }
    }
    Ok(socket)
}

/// Sets `ZMQ_USE_FD`, which the `zmq` crate does not wrap.
fn set_use_fd(socket: &mut zmq::Socket, fd: libc::c_int) -> Result<(), zmq::Error> {
    // SAFETY: the socket pointer is live for the call; the option value is a c_int.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            socket.as_mut_ptr(),
            zmq_sys::ZMQ_USE_FD as libc::c_int,
            (&fd as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() }))
    }
}
