//! A free loopback port for a daemon the test starts as a child process.

use std::net::TcpListener;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
