//! A server starved of CPU (here, stopped outright for longer than its
//! idle timeout) must not take its own stall for its clients' silence:
//! clients that sent a request in time, while it could not run, are
//! answered once it runs again, not closed as idle. (Before, the watchdog
//! and the connection raced when both woke at once, and the watchdog won
//! half the time: the HTTP/2 slow-reader test's setup once failed with a
//! broken pipe that way on a loaded machine.)

use crate::support::*;
use rustix::process::{kill_process, Pid, Signal};
use std::net::SocketAddr;
use std::time::Duration;

/// Clients that speak during the stall: were each closed with even odds,
/// all of them surviving would be a 1 in 256 chance.
const CLIENTS: usize = 8;

/// Sends SIGCONT when dropped, so that a failing test never leaves the
/// server stopped.
struct Stopped(Pid);

impl Stopped {
    fn stop(pid: u32) -> Self {
        let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
        kill_process(pid, Signal::STOP).unwrap();
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill_process(self.0, Signal::CONT);
    }
}

/// An HTTP/2 client from `from`, its connection driven in the background,
/// after one answered request.
async fn client(
    from: std::net::IpAddr,
    server: SocketAddr,
) -> h2::client::SendRequest<bytes::Bytes> {
    let io = connect_from_async(from, server).await;
    let mut client = h2_client(&h2::client::Builder::new(), io).await;
    let status = get(&mut client, server, "/healthz").await.unwrap();
    assert_eq!(status, 200);
    client
}

/// The status of one GET, within 10 s.
async fn get(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    server: SocketAddr,
    path: &str,
) -> Result<u16, String> {
    let req = http::Request::get(format!("http://{server}{path}"))
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(resp.status().as_u16())
}

#[test]
fn a_starved_server_answers_the_clients_that_spoke_while_it_could_not_run() {
    let _one = one_at_a_time();
    let mut lab = Lab::start(&[]);
    let addr = lab.server.addr;
    let rt = runtime();
    let idle_before = lab.metric(
        "oscontent_http_connections_expired_total",
        &[("reason", "idle")],
    );
    let clients = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..CLIENTS {
            v.push(client(abuser_ip(i), addr).await);
        }
        v
    });
    let stall = Duration::from_secs(IDLE) + Duration::from_millis(1500);
    let answers = {
        let stopped = Stopped::stop(lab.pid);
        // Each asks at once; the server cannot read it until it runs again.
        let asked: Vec<_> = clients
            .iter()
            .map(|c| {
                let mut c = c.clone();
                rt.spawn(async move { get(&mut c, addr, "/config").await })
            })
            .collect();
        std::thread::sleep(stall);
        drop(stopped);
        rt.block_on(async {
            let mut v = Vec::new();
            for a in asked {
                v.push(a.await.unwrap());
            }
            v
        })
    };
    let idle = lab.metric(
        "oscontent_http_connections_expired_total",
        &[("reason", "idle")],
    ) - idle_before;
    let ok = answers.iter().filter(|a| **a == Ok(200)).count();
    println!(
        "starved server: stopped {:.1} s (idle timeout {IDLE} s); {ok} of {CLIENTS} requests sent meanwhile answered, {idle} connections closed as idle",
        stall.as_secs_f64()
    );
    assert_eq!(ok, CLIENTS, "answers: {answers:?}");
    assert_eq!(idle, 0.0, "connections closed as idle");
    drop(clients);
    rt.shutdown_timeout(Duration::from_secs(1));
    lab.assert_recovered("starved server");
}
