//! The HTTP deliverer against real sockets: in-process servers on 127.0.0.1:0 that keep
//! connections alive, close them, chunk or close-delimit replies, redirect, fail, hang, answer
//! too much, or speak TLS with a test CA.

mod behaviour;
mod dead_letter;
mod parking;
mod policy;
mod server;
mod signing;
mod tls;
