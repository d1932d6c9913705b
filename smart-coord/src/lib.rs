//! The cluster's configuration in etcd: who the memory blades are, an epoch
//! that only moves forward, each database's replica order, and the compute
//! blades' memberships under etcd leases.
//!
//! Deciding which memory blades a cluster runs on after one is lost is
//! consensus; this crate leaves it to etcd (`etcd-server`, reached with the
//! `etcd-client` crate) rather than to a protocol of our own. Everything
//! lives under `/smart-rs/CLUSTER/`, where `CLUSTER` is the path of the
//! coordinator's URL (`http://127.0.0.1:2379/lab`; `default` without one):
//!
//! | key | value |
//! |---|---|
//! | `config` | [`Config`] as JSON: the epoch, the memory blades (address, identity, active or removed), each database's replica order |
//! | `members/LEASE` | a compute blade's [`Member`] record, under its etcd lease |
//! | `tags/TAG` | the same record under its fence tag, without a lease, until the run leaves cleanly: what a failover fences |
//!
//! The configuration changes only by an etcd transaction that compares
//! the revision it was read at ([`Coordinator::replace`]): of two compute
//! blades that propose a change from one epoch, one wins, and the other
//! reads the winner's. A compute blade acts under the epoch it has seen
//! ([`Coordinator::join`]): when the configuration moves past it, or etcd
//! lets its lease lapse, its [`Membership`] raises the halt flag that its
//! transactions check, so it stops locking and committing.
//!
//! While etcd is unreachable a compute blade runs on (saying so once):
//! nobody can change the configuration then, so the one it runs under stays
//! the cluster's; etcd renews every lease's time to live when it comes back
//! (a new leader extends them).
//!
//! The blocking API runs its requests on a small Tokio runtime of its own,
//! each bounded by the time-out given to [`Coordinator::connect`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, GetResponse, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// A coordinator URL that is not `http://HOST:PORT[/CLUSTER]`.
    #[error("--coordinator {0}")]
    Url(String),
    /// etcd did not answer in time, or refused the request.
    #[error("the coordinator at {url}: {why}")]
    Etcd {
        /// The coordinator's URL.
        url: String,
        /// What failed.
        why: String,
    },
    /// The configuration refuses what was asked (a blade it does not
    /// trust, a change that makes no sense).
    #[error("{0}")]
    Refused(String),
    /// The stored configuration does not parse.
    #[error("the configuration stored at {key} does not parse: {why}")]
    Corrupt {
        /// Its key.
        key: String,
        /// Why.
        why: String,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, CoordError>;

/// The cluster name when the URL has no path.
pub const DEFAULT_CLUSTER: &str = "default";

/// What the configuration says of a memory blade.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BladeState {
    /// In use.
    Active,
    /// Taken out of the configuration at `epoch`: not used again, even if
    /// it comes back, until it is re-replicated as a fresh blade.
    Removed {
        /// The epoch that removed it.
        epoch: u64,
        /// Why (for messages).
        why: String,
    },
    /// A fresh blade in a removed one's place, receiving its copies while
    /// transactions run (`compute-blade rebuild --online`) since `epoch`:
    /// written by every transaction, read by none, until it is taken in
    /// ([`Config::readmit`]).
    Joining {
        /// The epoch that made it joining.
        epoch: u64,
    },
}

/// A memory blade of the configuration (its index is its place in
/// [`Config::blades`], the index that global addresses name).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blade {
    /// Where it was reached when it was recorded.
    pub addr: String,
    /// The identity its superblock holds (drawn when it started on a new
    /// region), as `0x…`: a blade restarted without its data has another.
    #[serde(with = "hex_u64")]
    pub identity: u64,
    /// Active, joining or removed.
    #[serde(flatten)]
    pub state: BladeState,
}

/// The cluster's configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    /// Moves forward by one at every change of the memory blades.
    pub epoch: u64,
    /// The memory blades, by index.
    pub blades: Vec<Blade>,
    /// Each database's tables' replica order (blade indexes, primary
    /// first), as recorded when a compute blade first opened it under a
    /// coordinator.
    #[serde(default)]
    pub databases: BTreeMap<String, Vec<Vec<u16>>>,
    /// Fresh memory blades (addresses) waiting to take a removed blade's
    /// place: the compute blade whose failover proposal wins starts an
    /// online re-replication onto the first (`compute-blade rebuild
    /// --online`). Listing one does not move the epoch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spares: Vec<String>,
}

/// A configuration with the etcd revision it was read at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The configuration.
    pub config: Config,
    /// The key's modification revision (what [`Coordinator::replace`]
    /// compares).
    pub revision: i64,
}

/// The outcome of [`Coordinator::replace`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replaced {
    /// This proposal won: the configuration now stored.
    Won(Versioned),
    /// Another change came first: the configuration now stored.
    Lost(Versioned),
}

impl Config {
    /// Epoch 1 over `blades` (address, identity), all active.
    pub fn new(blades: &[(String, u64)]) -> Config {
        Config {
            epoch: 1,
            blades: blades
                .iter()
                .map(|(addr, identity)| Blade { addr: addr.clone(), identity: *identity, state: BladeState::Active })
                .collect(),
            databases: BTreeMap::new(),
            spares: Vec::new(),
        }
    }

    /// This configuration with `addr` listed as a spare (the same epoch).
    ///
    /// # Errors
    /// [`CoordError::Refused`] if it is listed already, or is a blade's.
    pub fn with_spare(&self, addr: &str) -> Result<Config> {
        if self.spares.iter().any(|a| a == addr) || self.blades.iter().any(|b| b.addr == addr) {
            return Err(CoordError::Refused(format!(
                "{addr} is already in the configuration (epoch {}: {}; spares {:?})",
                self.epoch,
                self.describe_blades(),
                self.spares
            )));
        }
        let mut next = self.clone();
        next.spares.push(addr.to_string());
        Ok(next)
    }

    /// This configuration without the spare `addr` (the same epoch).
    ///
    /// # Errors
    /// [`CoordError::Refused`] if it is not listed.
    pub fn without_spare(&self, addr: &str) -> Result<Config> {
        if !self.spares.iter().any(|a| a == addr) {
            return Err(CoordError::Refused(format!("{addr} is not a spare (spares {:?})", self.spares)));
        }
        let mut next = self.clone();
        next.spares.retain(|a| a != addr);
        Ok(next)
    }

    /// The indexes of the active blades.
    pub fn active(&self) -> Vec<u16> {
        (0..self.blades.len() as u16).filter(|i| self.blades[*i as usize].state == BladeState::Active).collect()
    }

    /// The indexes of the blades removed (out of the configuration).
    pub fn removed(&self) -> Vec<u16> {
        (0..self.blades.len() as u16)
            .filter(|i| matches!(self.blades[*i as usize].state, BladeState::Removed { .. }))
            .collect()
    }

    /// The indexes of the blades joining (receiving copies: written, not
    /// read).
    pub fn joining(&self) -> Vec<u16> {
        (0..self.blades.len() as u16)
            .filter(|i| matches!(self.blades[*i as usize].state, BladeState::Joining { .. }))
            .collect()
    }

    /// The indexes of the blades a failure can take out: active and
    /// joining.
    pub fn in_use(&self) -> Vec<u16> {
        (0..self.blades.len() as u16)
            .filter(|i| !matches!(self.blades[*i as usize].state, BladeState::Removed { .. }))
            .collect()
    }

    /// Checks that a run over `run` (each blade's address and identity, by
    /// index) runs on the blades this configuration trusts: the same
    /// blades, none removed.
    ///
    /// # Errors
    /// [`CoordError::Refused`], saying which blade and why.
    pub fn check_run(&self, run: &[(String, u64)]) -> Result<()> {
        self.check_run_without(run, &[])
    }

    /// [`Config::check_run`] of a run that goes without blades `absent`
    /// (their identities in `run` are not looked at): each must be one
    /// this configuration removed.
    ///
    /// # Errors
    /// As [`Config::check_run`]; an absent blade the configuration holds
    /// active.
    pub fn check_run_without(&self, run: &[(String, u64)], absent: &[u16]) -> Result<()> {
        let e = self.epoch;
        if run.len() != self.blades.len() {
            return Err(CoordError::Refused(format!(
                "this run names {} memory blades; the configuration (epoch {e}) has {}: {}",
                run.len(),
                self.blades.len(),
                self.describe_blades()
            )));
        }
        for (i, ((addr, identity), b)) in run.iter().zip(&self.blades).enumerate() {
            if absent.contains(&(i as u16)) {
                if !matches!(b.state, BladeState::Removed { .. }) {
                    return Err(CoordError::Refused(format!(
                        "memory blade {i} ({addr}) is in use in the configuration (epoch {e}): a run does not go \
                         without it"
                    )));
                }
                continue;
            }
            match &b.state {
                BladeState::Removed { epoch, why } if *identity == b.identity => {
                    return Err(CoordError::Refused(format!(
                        "memory blade {i} ({addr}, identity {identity:#018x}) was removed from the configuration at \
                         epoch {epoch} ({why}): a blade that was removed is not trusted again, even with its data \
                         (the cluster moved on without it); it rejoins only as a fresh blade, its copies written again"
                    )));
                }
                BladeState::Removed { epoch, why } => {
                    return Err(CoordError::Refused(format!(
                        "memory blade {i} ({addr}) was removed from the configuration at epoch {epoch} ({why}); a \
                         fresh blade (identity {identity:#018x}) takes its place only once its copies are written \
                         again: `compute-blade rebuild --lost {i} --coordinator …`"
                    )));
                }
                BladeState::Active | BladeState::Joining { .. } if *identity != b.identity => {
                    return Err(CoordError::Refused(format!(
                        "memory blade {i} ({addr}) has identity {identity:#018x}; the configuration (epoch {e}) \
                         names {:#018x} (at {}): it was restarted without its data, or replaced; rebuild it \
                         (`compute-blade rebuild --lost {i} --coordinator …`)",
                        b.identity, b.addr
                    )));
                }
                BladeState::Active | BladeState::Joining { .. } => {}
            }
        }
        Ok(())
    }

    /// This configuration without `blades`: the next epoch (one for all of
    /// them).
    ///
    /// # Errors
    /// [`CoordError::Refused`] if one is neither active nor joining, or no
    /// active blade would be left.
    pub fn without(&self, blades: &[u16], why: &str) -> Result<Config> {
        let active = self.active();
        let in_use = self.in_use();
        if let Some(b) = blades.iter().find(|b| !in_use.contains(b)) {
            return Err(CoordError::Refused(format!(
                "memory blade {b} is not a blade in use in the configuration (epoch {}: {})",
                self.epoch,
                self.describe_blades()
            )));
        }
        if active.iter().all(|a| blades.contains(a)) {
            return Err(CoordError::Refused(format!(
                "memory blade {} is the configuration's last active blade",
                active.last().copied().unwrap_or_default()
            )));
        }
        let mut next = self.clone();
        next.epoch += 1;
        for b in blades {
            next.blades[usize::from(*b)].state = BladeState::Removed { epoch: next.epoch, why: why.to_string() };
        }
        Ok(next)
    }

    /// This configuration with each blade `(index, addr, identity)` of
    /// `blades` (active or removed) now the blade of that identity at that
    /// address, active: the next epoch (one for all of them), after their
    /// copies were written again (e.g. by `compute-blade rebuild`).
    ///
    /// # Errors
    /// [`CoordError::Refused`] if the configuration has no such blade.
    pub fn readmit(&self, blades: &[(u16, String, u64)]) -> Result<Config> {
        let mut next = self.clone();
        next.epoch += 1;
        for (index, addr, identity) in blades {
            let Some(b) = next.blades.get_mut(usize::from(*index)) else {
                return Err(CoordError::Refused(format!(
                    "the configuration (epoch {}) has no memory blade {index}",
                    self.epoch
                )));
            };
            *b = Blade { addr: addr.clone(), identity: *identity, state: BladeState::Active };
        }
        Ok(next)
    }

    /// This configuration with the removed blade `index` now the fresh blade
    /// of `identity` at `addr`, joining: the next epoch. Transactions of it
    /// write the blade's copies and read none, while they are copied there
    /// (`compute-blade rebuild --online`); [`Config::readmit`] then takes it
    /// in.
    ///
    /// # Errors
    /// [`CoordError::Refused`] if the blade is not a removed one.
    pub fn join(&self, index: u16, addr: &str, identity: u64) -> Result<Config> {
        match self.blades.get(usize::from(index)).map(|b| &b.state) {
            Some(BladeState::Removed { .. }) => {}
            _ => {
                return Err(CoordError::Refused(format!(
                    "memory blade {index} is not a removed blade of the configuration (epoch {}: {})",
                    self.epoch,
                    self.describe_blades()
                )))
            }
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.blades[usize::from(index)] =
            Blade { addr: addr.to_string(), identity, state: BladeState::Joining { epoch: next.epoch } };
        // A spare that joins is one no more.
        next.spares.retain(|a| a != addr);
        Ok(next)
    }

    /// The blades for messages: `0 127.0.0.1:7000 active, 1 … removed at epoch 2`.
    pub fn describe_blades(&self) -> String {
        self.blades
            .iter()
            .enumerate()
            .map(|(i, b)| match &b.state {
                BladeState::Active => format!("{i} {} active", b.addr),
                BladeState::Removed { epoch, .. } => format!("{i} {} removed at epoch {epoch}", b.addr),
                BladeState::Joining { epoch } => format!("{i} {} joining since epoch {epoch}", b.addr),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A compute blade's membership record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// What it runs (`smallbank on database "smallbank"`).
    pub what: String,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The epoch it acts under.
    pub epoch: u64,
    /// The fence tag its verbs carry (its registration's nonce; 0 until
    /// it registered): what a failover revokes on the surviving memory
    /// blades.
    #[serde(default)]
    pub fence_tag: u64,
    /// Its etcd lease (filled in by [`Coordinator::join`]).
    #[serde(default)]
    pub lease: i64,
}

/// A connection to the coordinator (etcd).
#[derive(Clone)]
pub struct Coordinator {
    rt: Arc<tokio::runtime::Runtime>,
    client: Client,
    url: String,
    cluster: String,
    timeout: Duration,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").field("url", &self.url).field("cluster", &self.cluster).finish()
    }
}

/// Splits `http://HOST:PORT[,HOST:PORT…][/CLUSTER]` into the endpoints
/// (each `http://HOST:PORT`: the members of one etcd cluster, any of which
/// answers) and the cluster.
///
/// # Errors
/// [`CoordError::Url`] for anything else.
pub fn parse_url(spec: &str) -> Result<(Vec<String>, String)> {
    let bad = |why: &str| {
        CoordError::Url(format!(
            "{spec:?}: {why} (expected http://HOST:PORT[,HOST:PORT…][/CLUSTER]: one etcd member or several of one \
             etcd cluster)"
        ))
    };
    let rest = spec.strip_prefix("http://").ok_or_else(|| bad("not an http:// URL"))?;
    // Each member may be written as a URL of its own.
    let rest = rest.replace(",http://", ",");
    let (hosts, cluster) = match rest.split_once('/') {
        Some((h, c)) => (h, c.trim_end_matches('/')),
        None => (rest.as_str(), ""),
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',') {
        let (name, port) = host.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        if name.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad("a host and a port are needed"));
        }
        let e = format!("http://{host}");
        if endpoints.contains(&e) {
            return Err(bad(&format!("{host} is listed twice")));
        }
        endpoints.push(e);
    }
    if !cluster.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(bad("a cluster name is letters, digits, - and _"));
    }
    let cluster = if cluster.is_empty() { DEFAULT_CLUSTER } else { cluster };
    Ok((endpoints, cluster.to_string()))
}

impl Coordinator {
    /// Connects to etcd at `spec` (`http://HOST:PORT[,HOST:PORT…][/CLUSTER]`:
    /// with several members of one etcd cluster, requests go to those that
    /// answer, so the coordinator outlives a minority of them); every
    /// request is bounded by `timeout`.
    ///
    /// # Errors
    /// A bad URL; etcd not answering within `timeout`.
    pub fn connect(spec: &str, timeout: Duration) -> Result<Coordinator> {
        let (endpoints, cluster) = parse_url(spec)?;
        let url = match endpoints.as_slice() {
            [one] => one.clone(),
            _ => format!("http://{}", endpoints.iter().map(|e| &e["http://".len()..]).collect::<Vec<_>>().join(",")),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("coordinator")
            .enable_all()
            .build()
            .map_err(|e| CoordError::Etcd { url: url.clone(), why: format!("no runtime: {e}") })?;
        let opts = ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout);
        let client = rt
            .block_on(async { tokio::time::timeout(timeout, Client::connect(&endpoints, Some(opts))).await })
            .map_err(|_| CoordError::Etcd { url: url.clone(), why: format!("no answer within {timeout:?}") })?
            .map_err(|e| CoordError::Etcd { url: url.clone(), why: e.to_string() })?;
        let c = Coordinator { rt: Arc::new(rt), client, url, cluster, timeout };
        // Connecting is lazy: one request says whether etcd is there.
        c.load()?;
        Ok(c)
    }

    /// Its URL (without the cluster).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    fn key(&self, what: &str) -> String {
        format!("/smart-rs/{}/{what}", self.cluster)
    }

    /// Waits for request `f` (bounded by the time-out: [`retried`]), its
    /// error told as `what` failing at this coordinator.
    fn wait<T>(&self, what: &str, f: impl std::future::Future<Output = std::result::Result<T, String>>) -> Result<T> {
        self.rt.block_on(f).map_err(|why| CoordError::Etcd { url: self.url.clone(), why: format!("{what}: {why}") })
    }

    /// Transaction `txn` ([`send_txn`]).
    fn txn(&self, what: &str, txn: &Txn) -> Result<TxnResponse> {
        self.wait(what, send_txn(self.timeout, &self.client, txn))
    }

    /// The value of `key`, or with `prefix` of every key under it ([`get`]).
    fn get(&self, what: &str, key: &str, prefix: bool) -> Result<GetResponse> {
        self.wait(what, get(self.timeout, &self.client, key, prefix))
    }

    /// The stored configuration, if any.
    ///
    /// # Errors
    /// etcd errors; a configuration that does not parse.
    pub fn load(&self) -> Result<Option<Versioned>> {
        let key = self.key("config");
        let r = self.get("reading the configuration", &key, false)?;
        r.kvs().first().map(|kv| parse(&key, kv.value(), kv.mod_revision())).transpose()
    }

    /// Writes the configuration's epoch alone under `epoch` if it is not
    /// there (a configuration stored by an older version): what fence tags
    /// are recorded against.
    ///
    /// # Errors
    /// etcd errors.
    fn ensure_epoch_key(&self) -> Result<()> {
        let Some(v) = self.load()? else { return Ok(()) };
        let ek = self.key("epoch");
        let txn = Txn::new()
            .when([
                Compare::create_revision(ek.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(self.key("config"), CompareOp::Equal, v.revision),
            ])
            .and_then([TxnOp::put(ek, v.config.epoch.to_string(), None)]);
        self.txn("recording the epoch", &txn)?;
        Ok(())
    }

    /// The stored configuration, or `initial`, stored if there was none.
    /// Returns it and whether it was created now.
    ///
    /// # Errors
    /// As [`Coordinator::load`].
    pub fn create_or_load(&self, initial: &Config) -> Result<(Versioned, bool)> {
        let key = self.key("config");
        let value = serde_json::to_vec(initial).expect("a configuration serializes");
        let epoch = TxnOp::put(self.key("epoch"), initial.epoch.to_string(), None);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value, None), epoch, TxnOp::get(key.clone(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let r = self.txn("creating the configuration", &txn)?;
        let got = txn_get(&key, &r.op_responses())?;
        Ok((got, r.succeeded()))
    }

    /// Replaces configuration `from` by `to` if nothing changed it since
    /// `from` was read (an etcd transaction on its revision). A transaction
    /// sent but unanswered (its etcd member, or the cluster's leader, died
    /// meanwhile) is resolved by reading the configuration back: unchanged,
    /// it is sent again; holding `to`, it is taken as won (another
    /// proposal of exactly the same configuration would be taken so too).
    ///
    /// # Errors
    /// [`CoordError::Refused`] if `to` would move the epoch back; etcd
    /// errors.
    pub fn replace(&self, from: &Versioned, to: &Config) -> Result<Replaced> {
        if to.epoch < from.config.epoch {
            return Err(CoordError::Refused(format!(
                "a configuration of epoch {} cannot replace epoch {}",
                to.epoch, from.config.epoch
            )));
        }
        let key = self.key("config");
        let value = serde_json::to_vec(to).expect("a configuration serializes");
        // The epoch alone too, in the same transaction: members record their
        // fence tags only while it is theirs (`record_txn`).
        let epoch = TxnOp::put(self.key("epoch"), to.epoch.to_string(), None);
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, from.revision)])
            .and_then([TxnOp::put(key.clone(), value, None), epoch, TxnOp::get(key.clone(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let end = std::time::Instant::now() + self.timeout;
        for _ in 0..3 {
            let sent = self.txn("changing the configuration", &txn);
            let r = match sent {
                Ok(r) => r,
                // Sent, and no answer (the member died, or its leader did):
                // the outcome is read back. Unchanged, it did not apply;
                // `to` stored, it did.
                Err(e) => match self.load() {
                    Ok(Some(now)) if now.revision == from.revision && std::time::Instant::now() < end => continue,
                    Ok(Some(now)) if now.revision == from.revision => return Err(e),
                    Ok(Some(now)) if now.config == *to => return Ok(Replaced::Won(now)),
                    Ok(Some(now)) => return Ok(Replaced::Lost(now)),
                    _ => return Err(e),
                },
            };
            let got = txn_get(&key, &r.op_responses())?;
            return Ok(if r.succeeded() { Replaced::Won(got) } else { Replaced::Lost(got) });
        }
        Err(CoordError::Etcd {
            url: self.url.clone(),
            why: "changing the configuration: three tries went unanswered, and it is unchanged".into(),
        })
    }

    /// Applies `change` to the stored configuration until it sticks (other
    /// changes coming first are re-read and `change` applied to them);
    /// `change` returning `None` leaves it as it is. Returns what is stored.
    ///
    /// # Errors
    /// No configuration stored; what `change` returns; etcd errors.
    pub fn update<F>(&self, mut change: F) -> Result<Versioned>
    where
        F: FnMut(&Config) -> Result<Option<Config>>,
    {
        let mut now = self.load()?.ok_or_else(|| {
            CoordError::Refused(format!("the coordinator holds no configuration for cluster {:?}", self.cluster))
        })?;
        for _ in 0..100 {
            let Some(next) = change(&now.config)? else { return Ok(now) };
            match self.replace(&now, &next)? {
                Replaced::Won(v) => return Ok(v),
                Replaced::Lost(v) => now = v,
            }
        }
        Err(CoordError::Etcd {
            url: self.url.clone(),
            why: "the configuration changed 100 times under this change".into(),
        })
    }

    /// Registers `member` under a new etcd lease of `ttl` (whole seconds,
    /// at least 2), acting under `epoch`, and keeps it alive from a task
    /// of its own until [`Membership::leave`] (or a drop, which lets the
    /// lease run out). See [`Membership`] for when it raises `halt`. Once
    /// `fence_tag` is set (non-zero), the record says it (within a third of
    /// `ttl`).
    ///
    /// # Errors
    /// etcd errors.
    pub fn join(
        &self,
        member: &Member,
        ttl: Duration,
        epoch: u64,
        halt: Arc<AtomicBool>,
        fence_tag: Arc<AtomicU64>,
    ) -> Result<Membership> {
        let ttl_s = ttl.as_secs().max(2) as i64;
        self.ensure_epoch_key()?;
        let grant =
            retried(self.timeout, Kind::Write, &self.client, |mut c| async move { c.lease_grant(ttl_s, None).await });
        let lease = self.wait("granting a lease", grant)?.id();
        let key = self.key(&format!("members/{lease:016x}"));
        let record = Member { epoch, lease, fence_tag: fence_tag.load(Ordering::SeqCst), ..member.clone() };
        let epoch_key = self.key("epoch");
        let txn = record_txn(&key, &self.key("tags/"), &epoch_key, &record);
        self.txn("recording the membership", &txn)?;
        let shared = Arc::new(MemberShared {
            halt,
            why: Mutex::new(None),
            stop: AtomicBool::new(false),
            recorded: Arc::new(AtomicU64::new(record.fence_tag)),
        });
        let task = self.rt.spawn(keep_member(
            self.client.clone(),
            KeepArgs {
                lease,
                ttl: Duration::from_secs(ttl_s as u64),
                epoch,
                config_key: self.key("config"),
                member_key: key,
                tags_prefix: self.key("tags/"),
                epoch_key,
                record,
                fence_tag,
                url: self.url.clone(),
                timeout: self.timeout,
                shared: shared.clone(),
            },
        ));
        Ok(Membership {
            rt: self.rt.clone(),
            client: self.client.clone(),
            url: self.url.clone(),
            tags_prefix: self.key("tags/"),
            lease,
            shared,
            task: Some(task),
            timeout: self.timeout,
        })
    }

    /// Claims task `what` for `by` (`claims/WHAT`, written once, kept):
    /// whether this call got it. Of several compute blades that try, one
    /// does; an answer lost on the way is read back (the claim holding
    /// `by` is this one's).
    ///
    /// # Errors
    /// etcd errors (the claim then may or may not be held by another).
    pub fn claim(&self, what: &str, by: &str) -> Result<bool> {
        let key = self.key(&format!("claims/{what}"));
        let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key.clone(),
            by,
            None,
        )]);
        let sent = self.txn("claiming a task", &txn);
        match sent {
            Ok(r) => Ok(r.succeeded()),
            Err(e) => {
                let held = self.get("reading a claim", &key, false);
                match held {
                    Ok(r) => Ok(r.kvs().first().is_some_and(|kv| kv.value() == by.as_bytes())),
                    Err(_) => Err(e),
                }
            }
        }
    }

    /// Every member's record kept under its fence tag (`tags/`), lease or
    /// not: those that registered and did not leave (a failover fences
    /// them all).
    ///
    /// # Errors
    /// etcd errors; a record that does not parse.
    pub fn fence_records(&self) -> Result<Vec<Member>> {
        let prefix = self.key("tags/");
        let r = self.get("reading the fence tags", &prefix, true)?;
        r.kvs()
            .iter()
            .map(|kv| {
                serde_json::from_slice(kv.value()).map_err(|e| CoordError::Corrupt {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    why: e.to_string(),
                })
            })
            .collect()
    }

    /// The compute blades whose membership runs.
    ///
    /// # Errors
    /// etcd errors.
    pub fn members(&self) -> Result<Vec<Member>> {
        let prefix = self.key("members/");
        let r = self.get("reading the members", &prefix, true)?;
        let mut out = Vec::new();
        for kv in r.kvs() {
            let mut m: Member = serde_json::from_slice(kv.value()).map_err(|e| CoordError::Corrupt {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                why: e.to_string(),
            })?;
            m.lease = kv.lease();
            out.push(m);
        }
        Ok(out)
    }
}

fn parse(key: &str, value: &[u8], revision: i64) -> Result<Versioned> {
    let config =
        serde_json::from_slice(value).map_err(|e| CoordError::Corrupt { key: key.into(), why: e.to_string() })?;
    Ok(Versioned { config, revision })
}

/// The configuration a transaction's last GET read.
fn txn_get(key: &str, ops: &[TxnOpResponse]) -> Result<Versioned> {
    for op in ops.iter().rev() {
        if let TxnOpResponse::Get(g) = op {
            if let Some(kv) = g.kvs().first() {
                return parse(key, kv.value(), kv.mod_revision());
            }
        }
    }
    Err(CoordError::Corrupt { key: key.into(), why: "gone right after it was written".into() })
}

/// The writes of member record `rec`: under `member_key` with its lease,
/// and, once it has a fence tag, under `tags_prefix` + the tag without one
/// (a member whose lease lapses, a paused process, is still fenced by the
/// next failover).
/// The transaction that records member `rec` (and its fence tag, if it
/// has one). A fence tag is recorded only while the configuration's epoch
/// is still the member's: one that moved on may have fenced the earlier
/// epoch's tags already, and a tag recorded after that fencing would let a
/// registration of the old epoch lock under a view that is no longer the
/// cluster's (write without a joining blade, say). The transaction then
/// fails, and the member does not lock.
fn record_txn(member_key: &str, tags_prefix: &str, epoch_key: &str, rec: &Member) -> Txn {
    let value = serde_json::to_vec(rec).expect("a member record serializes");
    let mut ops = vec![TxnOp::put(member_key, value.clone(), Some(PutOptions::new().with_lease(rec.lease)))];
    if rec.fence_tag == 0 {
        return Txn::new().and_then(ops);
    }
    ops.push(TxnOp::put(format!("{tags_prefix}{:016x}", rec.fence_tag), value, None));
    Txn::new().when([Compare::value(epoch_key, CompareOp::Equal, rec.epoch.to_string())]).and_then(ops)
}

struct MemberShared {
    halt: Arc<AtomicBool>,
    why: Mutex<Option<String>>,
    stop: AtomicBool,
    /// The fence tag recorded under `tags/` (0: none yet).
    recorded: Arc<AtomicU64>,
}

impl MemberShared {
    fn halt(&self, why: String) {
        *self.why.lock().expect("not poisoned") = Some(why);
        self.halt.store(true, Ordering::SeqCst);
    }
}

/// A compute blade's membership: its etcd lease, kept alive every third of
/// its time to live. It raises the halt flag given to
/// [`Coordinator::join`] (and says why, [`Membership::why`]) when
///
/// - etcd answers that the lease is gone (it expired, or was revoked):
///   other compute blades may have taken this one for dead;
/// - the configuration's epoch moved past the one it acts under.
///
/// etcd not answering does neither: the compute blade runs on (see the
/// crate docs) and says so once on stderr.
pub struct Membership {
    rt: Arc<tokio::runtime::Runtime>,
    client: Client,
    url: String,
    tags_prefix: String,
    lease: i64,
    shared: Arc<MemberShared>,
    task: Option<tokio::task::JoinHandle<()>>,
    timeout: Duration,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership").field("lease", &self.lease).finish()
    }
}

impl Membership {
    /// Its etcd lease.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// The fence tag recorded under `tags/` so far (0: none): set once the
    /// tag given to [`Coordinator::join`] is on record.
    pub fn recorded_tag(&self) -> Arc<AtomicU64> {
        self.shared.recorded.clone()
    }

    /// Why it raised the halt flag, if it did.
    pub fn why(&self) -> Option<String> {
        self.shared.why.lock().expect("not poisoned").clone()
    }

    /// Ends the membership: stops the keep-alive, removes its fence tag's
    /// record and revokes the lease (its record goes with it), as a process
    /// does before it exits (one that exits sends no verb again; one that is
    /// paused, or dies, never gets here, and its tag stays for the next
    /// failover to fence).
    ///
    /// # Errors
    /// etcd errors (the lease then runs out by itself).
    pub fn leave(mut self) -> Result<()> {
        self.stop_task();
        let mut c = self.client.clone();
        let (lease, t) = (self.lease, self.timeout);
        let tag = self.shared.recorded.load(Ordering::SeqCst);
        if tag != 0 {
            let key = format!("{}{tag:016x}", self.tags_prefix);
            let _ = self.rt.block_on(async { tokio::time::timeout(t, c.delete(key, None)).await });
        }
        let why = match self.rt.block_on(async { tokio::time::timeout(t, c.lease_revoke(lease)).await }) {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => format!("revoking lease {lease:x}: {e}"),
            Err(_) => format!("revoking lease {lease:x}: no answer within {t:?}"),
        };
        Err(CoordError::Etcd { url: self.url.clone(), why })
    }

    fn stop_task(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop_task();
    }
}

/// Whether error `e` is gRPC's UNAVAILABLE: no connection to the member
/// the client's balancer chose, or that member without a leader (an
/// election after the leader died).
fn unavailable(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() as i32 == 14)
}

/// Whether error `e` says that the request never left this host: no
/// connection to the etcd member the balancer chose (killed, or not
/// started). Such a request can be sent again, to another member, with no
/// risk of applying it twice (etcd's own client retries writes only then).
fn unsent(e: &etcd_client::Error) -> bool {
    unavailable(e) && matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("connect"))
}

/// What may be sent again after an error: a write only if it was not
/// sent ([`unsent`]); a read (it changes nothing) after any UNAVAILABLE.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Read,
    Write,
}

/// Runs one request, `f` (given a client, called again for each try), until
/// it is answered, fails otherwise than its `kind` may be sent again, or
/// `t` passes: with several members, the balancer's next pick may be one
/// that answers, and an election ends within a second or two. The error
/// says why (the last error, if time ran out after one).
async fn retried<T, F, Fut>(t: Duration, kind: Kind, client: &Client, mut f: F) -> std::result::Result<T, String>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let end = tokio::time::Instant::now() + t;
    let mut last = None;
    loop {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(last.map_or_else(|| format!("no answer within {t:?}"), |e: etcd_client::Error| e.to_string()));
        }
        match tokio::time::timeout(left, f(client.clone())).await {
            Err(_) => return Err(format!("no answer within {t:?}")),
            Ok(Err(e)) if unsent(&e) || (kind == Kind::Read && unavailable(&e)) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(20).min(left)).await;
            }
            Ok(r) => return r.map_err(|e| e.to_string()),
        }
    }
}

/// Transaction `txn`, sent again only if it was not sent ([`retried`]).
async fn send_txn(t: Duration, client: &Client, txn: &Txn) -> std::result::Result<TxnResponse, String> {
    retried(t, Kind::Write, client, |mut c| {
        let txn = txn.clone();
        async move { c.txn(txn).await }
    })
    .await
}

/// A read of `key`, or with `prefix` of every key under it ([`retried`]).
async fn get(t: Duration, client: &Client, key: &str, prefix: bool) -> std::result::Result<GetResponse, String> {
    retried(t, Kind::Read, client, |mut c| {
        let opts = prefix.then(|| GetOptions::new().with_prefix());
        let key = key.to_string();
        async move { c.get(key, opts).await }
    })
    .await
}

/// How often a membership looks for its fence tag.
const TICK: Duration = Duration::from_millis(50);

struct KeepArgs {
    /// The key holding the configuration's epoch alone.
    epoch_key: String,
    lease: i64,
    ttl: Duration,
    epoch: u64,
    config_key: String,
    member_key: String,
    tags_prefix: String,
    record: Member,
    fence_tag: Arc<AtomicU64>,
    url: String,
    timeout: Duration,
    shared: Arc<MemberShared>,
}

/// One keep-alive of `lease`: `Some(ttl)` as etcd answered (≤ 0: the
/// lease is gone), `None` if etcd did not answer (in time).
async fn keep_once(client: &mut Client, lease: i64, timeout: Duration) -> Option<i64> {
    let once = retried(timeout, Kind::Read, client, |mut c| async move {
        let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
        keeper.keep_alive().await?;
        Ok(stream.message().await?.map(|r| r.ttl()))
    });
    match once.await {
        Ok(Some(ttl)) if ttl > 0 => Some(ttl),
        // A keep-alive of a lease that is gone may end its stream instead
        // of answering TTL 0: ask for the lease itself (-1: not found).
        _ => retried(timeout, Kind::Read, client, |mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .ok()
            .map(|r| r.ttl()),
    }
}

async fn keep_member(mut client: Client, mut a: KeepArgs) {
    let period = a.ttl / 3;
    let mut unreachable = false;
    let mut next = tokio::time::Instant::now() + period;
    while !a.shared.stop.load(Ordering::SeqCst) {
        // The fence tag is recorded within a tick of the registration;
        // the keep-alive and the epoch check run every period.
        tokio::time::sleep(TICK.min(next.saturating_duration_since(tokio::time::Instant::now()))).await;
        let tag = a.fence_tag.load(Ordering::SeqCst);
        if tag != a.record.fence_tag {
            let rec = Member { fence_tag: tag, ..a.record.clone() };
            let txn = record_txn(&a.member_key, &a.tags_prefix, &a.epoch_key, &rec);
            if let Ok(r) = send_txn(a.timeout.min(period), &client, &txn).await {
                a.record.fence_tag = tag;
                if r.succeeded() {
                    a.shared.recorded.store(tag, Ordering::SeqCst);
                } else {
                    a.shared.halt(format!(
                        "the configuration moved past epoch {} before this compute blade's fence tag was recorded: \
                         it does not lock under that epoch",
                        a.epoch
                    ));
                }
            }
        }
        if tokio::time::Instant::now() < next {
            continue;
        }
        next += period;
        match keep_once(&mut client, a.lease, a.timeout.min(period)).await {
            Some(ttl) if ttl > 0 => {
                if unreachable {
                    eprintln!("coordinator: {} answers again", a.url);
                    unreachable = false;
                }
            }
            Some(_) => {
                a.shared.halt(format!(
                    "the coordinator at {} let this compute blade's membership lapse (lease {:x} expired): other \
                     compute blades may have taken it for dead",
                    a.url, a.lease
                ));
                return;
            }
            None => {
                if !unreachable {
                    eprintln!(
                        "warning: the coordinator at {} does not answer: running on under epoch {} (no \
                         reconfiguration is possible meanwhile)",
                        a.url, a.epoch
                    );
                    unreachable = true;
                }
                continue;
            }
        }
        if let Ok(r) = get(a.timeout.min(period), &client, &a.config_key, false).await {
            if let Some(kv) = r.kvs().first() {
                if let Ok(v) = parse(&a.config_key, kv.value(), kv.mod_revision()) {
                    if v.config.epoch > a.epoch {
                        a.shared.halt(format!(
                            "the configuration moved to epoch {} ({}); this compute blade acted under epoch {} and \
                             stops",
                            v.config.epoch,
                            v.config.describe_blades(),
                            a.epoch
                        ));
                        return;
                    }
                }
            }
        }
    }
}

mod hex_u64 {
    pub(crate) fn serialize<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:#018x}"))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        let h = s.strip_prefix("0x").ok_or_else(|| serde::de::Error::custom(format!("{s:?}: not 0x…")))?;
        u64::from_str_radix(h, 16).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_endpoints_and_a_cluster() {
        let one = |e: &str| vec![e.to_string()];
        assert_eq!(parse_url("http://127.0.0.1:2379").unwrap(), (one("http://127.0.0.1:2379"), "default".into()));
        assert_eq!(parse_url("http://h:1/lab/").unwrap(), (one("http://h:1"), "lab".into()));
        let three = vec!["http://a:1".to_string(), "http://b:2".into(), "http://c:3".into()];
        assert_eq!(parse_url("http://a:1,b:2,c:3/lab").unwrap(), (three.clone(), "lab".into()));
        assert_eq!(parse_url("http://a:1,http://b:2,c:3").unwrap(), (three, "default".into()));
        for bad in [
            "127.0.0.1:2379",
            "http://h",
            "http://:1",
            "http://h:x",
            "http://h:1/a/b",
            "https://h:1",
            "http://a:1,",
            "http://a:1,b",
            "http://a:1,a:1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    fn cfg() -> Config {
        Config::new(&[("a:1".into(), 0x11 << 16), ("b:1".into(), 0x22 << 16), ("c:1".into(), 0x33 << 16)])
    }

    #[test]
    fn a_configuration_round_trips_as_json() {
        let mut c = cfg().without(&[1], "lost").unwrap();
        c.databases.insert("bank".into(), vec![vec![0, 1], vec![1, 2]]);
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"identity\":\"0x0000000000220000\""), "{j}");
        assert_eq!(serde_json::from_str::<Config>(&j).unwrap(), c);
    }

    #[test]
    fn a_run_is_checked_against_the_blades_it_trusts() {
        let run =
            |ids: [u64; 3]| ["a:1", "b:1", "c:1"].iter().zip(ids).map(|(a, i)| (a.to_string(), i)).collect::<Vec<_>>();
        let c = cfg();
        c.check_run(&run([0x11 << 16, 0x22 << 16, 0x33 << 16])).unwrap();
        let e = c.check_run(&run([0x11 << 16, 0x99 << 16, 0x33 << 16])).unwrap_err().to_string();
        assert!(e.contains("memory blade 1 (b:1) has identity") && e.contains("rebuild"), "{e}");
        let removed = c.without(&[1], "SIGKILLed").unwrap();
        assert_eq!((removed.epoch, removed.active()), (2, vec![0, 2]));
        let e = removed.check_run(&run([0x11 << 16, 0x22 << 16, 0x33 << 16])).unwrap_err().to_string();
        assert!(
            e.contains("was removed from the configuration at epoch 2 (SIGKILLed)") && e.contains("not trusted"),
            "{e}"
        );
        let e = removed.check_run(&run([0x11 << 16, 0x77 << 16, 0x33 << 16])).unwrap_err().to_string();
        assert!(e.contains("a fresh blade"), "{e}");
        // A run that goes without the removed blade: only the others count.
        assert_eq!(removed.removed(), [1]);
        removed.check_run_without(&run([0x11 << 16, 0, 0x33 << 16]), &[1]).unwrap();
        let e = removed.check_run_without(&run([0x11 << 16, 0, 0x99 << 16]), &[1]).unwrap_err().to_string();
        assert!(e.contains("memory blade 2 (c:1) has identity"), "{e}");
        let e = c.check_run_without(&run([0x11 << 16, 0, 0x33 << 16]), &[1]).unwrap_err().to_string();
        assert!(e.contains("is in use in the configuration"), "{e}");
        let back = removed.readmit(&[(1, "b:2".into(), 0x77 << 16)]).unwrap();
        assert_eq!((back.epoch, back.active()), (3, vec![0, 1, 2]));
        back.check_run(&run([0x11 << 16, 0x77 << 16, 0x33 << 16])).unwrap();
        assert!(c.check_run(&run([1, 2, 3])[..2]).is_err(), "fewer blades");
        assert!(removed.without(&[1], "again").is_err());
        assert!(Config::new(&[("a:1".into(), 1 << 16)]).without(&[0], "last").is_err());
    }

    #[test]
    fn a_fresh_blade_joins_then_is_taken_in() {
        let run =
            |ids: [u64; 3]| ["a:1", "b:2", "c:1"].iter().zip(ids).map(|(a, i)| (a.to_string(), i)).collect::<Vec<_>>();
        let removed = cfg().without(&[1], "SIGKILLed").unwrap();
        assert!(cfg().join(1, "b:2", 0x77 << 16).is_err(), "an active blade does not join");
        let j = removed.join(1, "b:2", 0x77 << 16).unwrap();
        assert_eq!(
            (j.epoch, j.active(), j.joining(), j.removed(), j.in_use()),
            (3, vec![0, 2], vec![1], vec![], vec![0, 1, 2])
        );
        assert!(j.describe_blades().contains("1 b:2 joining since epoch 3"), "{}", j.describe_blades());
        assert_eq!(serde_json::from_str::<Config>(&serde_json::to_string(&j).unwrap()).unwrap(), j);
        // A run during the join checks the joining blade's identity.
        j.check_run(&run([0x11 << 16, 0x77 << 16, 0x33 << 16])).unwrap();
        assert!(j.check_run(&run([0x11 << 16, 0x22 << 16, 0x33 << 16])).is_err());
        assert!(j.check_run_without(&run([0x11 << 16, 0, 0x33 << 16]), &[1]).is_err(), "not absent");
        assert!(j.join(1, "b:3", 0x88 << 16).is_err(), "joining already");
        // Spares: listed at the same epoch, taken off when they join.
        let sp = removed.with_spare("d:1").unwrap();
        assert_eq!((sp.epoch, sp.spares.clone()), (removed.epoch, vec!["d:1".to_string()]));
        assert!(sp.with_spare("d:1").is_err() && sp.with_spare("a:1").is_err());
        assert_eq!(serde_json::from_str::<Config>(&serde_json::to_string(&sp).unwrap()).unwrap(), sp);
        assert!(sp.join(1, "d:1", 0x99 << 16).unwrap().spares.is_empty());
        assert!(sp.without_spare("d:1").unwrap().spares.is_empty());
        assert!(removed.without_spare("d:1").is_err());
        // A joining blade that fails is removed again.
        let again = j.without(&[1], "died while joining").unwrap();
        assert_eq!((again.epoch, again.removed()), (4, vec![1]));
        let back = j.readmit(&[(1, "b:2".into(), 0x77 << 16)]).unwrap();
        assert_eq!((back.epoch, back.active(), back.joining()), (4, vec![0, 1, 2], vec![]));
    }
}
