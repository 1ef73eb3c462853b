//! The frontend's two engine-facing sockets, each adopted from an inherited
//! listener fd (never a fresh bind) or bound to a given address. Both are
//! plain listeners: the runtime speaks ZeroMQ on their connections itself, a
//! ROUTER on the input one (`input_socket.rs`), a PULL on the output one (`zmtp.rs`).

use crate::fds::ListeningSocket;
use crate::listener::StreamListener;
use anyhow::{Context, Result};

/// Where a frontend socket comes from.
#[derive(Debug)]
pub enum SocketSource {
    /// An inherited listener, adopted.
    Listener(ListeningSocket),
    /// An address to bind (for engines started elsewhere).
    Address(String),
}

/// Opens the `name` ("input" or "output") listener, where the engines connect.
pub fn open_engine_listener(source: SocketSource, name: &str) -> Result<StreamListener> {
    match source {
        SocketSource::Address(address) => {
            let listener =
                StreamListener::bind_endpoint(&address).with_context(|| format!("opening the {name} socket"))?;
            tracing::debug!(%address, "{name} socket bound");
            Ok(listener)
        }
        SocketSource::Listener(listener) => {
            let endpoint = listener.address.zmq_endpoint();
            let adopted =
                StreamListener::from_socket(listener).with_context(|| format!("adopting the {name} listener"))?;
            tracing::debug!(%endpoint, "{name} socket adopted its listener");
            Ok(adopted)
        }
    }
}
