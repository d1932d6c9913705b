//! etcd on loopback for tests of the coordinator, one member or a cluster
//! of several ([`Etcd::cluster`]): started from Debian's `etcd-server`
//! package (`etcd` on the `PATH`, or `SMART_ETCD`), on free loopback
//! ports, each member in a data directory of its own (in `/dev/shm` where
//! there is one: see `data_dir`), and killed by its process id when
//! dropped.
//!
//! A test that needs etcd fails (it is not skipped) where etcd is not
//! installed: the message says how to install it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    /// Its client URL (`http://127.0.0.1:PORT`).
    pub url: String,
    client: SocketAddr,
    peer: u16,
    /// Its member name, and the cluster's members (`NAME=PEER_URL,…`).
    name: String,
    initial: String,
    dir: PathBuf,
    log: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a loopback port").local_addr().expect("its address").port()
}

/// Where members keep their data: in memory (`/dev/shm`) where there is
/// one. On the disk, etcd's fsyncs waited behind the test suite's own
/// writes (backing files, rebuilds) long enough that a 2 s membership
/// lease expired while its keep-alives waited (seen twice in CI
/// rehearsals); the tests are of this project's use of etcd, not of its
/// durability.
fn data_dir(name: &str) -> PathBuf {
    let shm = std::path::Path::new("/dev/shm").join(name);
    if std::fs::create_dir_all(&shm).is_ok() {
        return shm;
    }
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("a data directory");
    dir
}

fn binary() -> String {
    std::env::var("SMART_ETCD").unwrap_or_else(|_| "etcd".into())
}

impl Etcd {
    /// Starts etcd and waits (up to 20 s) until it serves clients.
    ///
    /// # Panics
    /// If etcd is not installed or does not come up (its log is printed).
    pub fn start() -> Etcd {
        Etcd::cluster(1).pop().expect("one member")
    }

    /// Starts an etcd cluster of `n` members and waits (up to 20 s) until
    /// each serves clients. [`Etcd::urls`] names them all for a client.
    ///
    /// # Panics
    /// As [`Etcd::start`].
    pub fn cluster(n: usize) -> Vec<Etcd> {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}")).collect();
        let mut members: Vec<Etcd> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let dir = data_dir(&format!("smart-etcd-{}-{client}", std::process::id()));
                Etcd {
                    child: None,
                    url: format!("http://127.0.0.1:{client}"),
                    client: SocketAddr::from(([127, 0, 0, 1], client)),
                    peer,
                    name: format!("m{i}"),
                    initial: initial.join(","),
                    log: dir.with_extension("log"),
                    dir,
                }
            })
            .collect();
        // All at once: a member of several serves once a quorum is up.
        for m in &mut members {
            m.launch();
        }
        for m in &mut members {
            m.wait_serving();
        }
        members
    }

    /// The client URL of every member of `cluster`, for a coordinator
    /// (`http://127.0.0.1:A,127.0.0.1:B,…`).
    pub fn urls(cluster: &[Etcd]) -> String {
        let hosts: Vec<String> = cluster.iter().map(|m| m.client.to_string()).collect();
        format!("http://{}", hosts.join(","))
    }

    fn spawn(&mut self) {
        self.launch();
        self.wait_serving();
    }

    fn launch(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let log = std::fs::File::create(&self.log).expect("a log file");
        let child = Command::new(binary())
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &self.url, "--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial, "--initial-cluster-state", "new", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("a log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): install etcd (Debian: apt-get install etcd-server) or set SMART_ETCD",
                    binary()
                )
            });
        self.child = Some(child);
    }

    fn wait_serving(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if TcpStream::connect_timeout(&self.client, Duration::from_millis(200)).is_ok() && self.healthy() {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("etcd exited ({st}) at start: {}", std::fs::read_to_string(&self.log).unwrap_or_default());
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not serve within 20 s: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `GET /health` answers healthy.
    fn healthy(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect_timeout(&self.client, Duration::from_millis(500)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!("GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", self.client);
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.contains("\"health\":\"true\"")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Stops it with SIGKILL (its data stays, for [`Etcd::restart`]).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on its data, at the same address.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.log);
    }
}
