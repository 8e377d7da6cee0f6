//! A placer that tries to reach the network: a TCP connection to `127.0.0.1:5432` (where a
//! PostgreSQL would listen) and a UDP socket. If either works it answers
//! `err("SOCKET: …")`; otherwise, as it must be, it places the request normally (first fit).
//!
//! Built with Rust's standard library for wasm32-wasip2, this component imports
//! `wasi:sockets`; a host that does not provide them refuses the component when it loads.

use std::net::{TcpStream, UdpSocket};
use std::time::Duration;

use placer_fixture::{Candidates, Level, Placement, Placer, Request, first_fit, log};

struct OpenSocket;

impl Placer for OpenSocket {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        let target = "127.0.0.1:5432".parse().expect("a socket address");
        match TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
            Ok(_) => return Err("SOCKET: connected".to_string()),
            Err(err) => log(Level::Debug, &format!("open-socket: tcp: {err}")),
        }
        match UdpSocket::bind("0.0.0.0:0").and_then(|s| s.send_to(b"orl", "127.0.0.1:5432")) {
            Ok(_) => return Err("SOCKET: sent a UDP datagram".to_string()),
            Err(err) => log(Level::Debug, &format!("open-socket: udp: {err}")),
        }
        first_fit(&req, &candidates)
    }
}

placer_fixture::export_placer!(OpenSocket);
