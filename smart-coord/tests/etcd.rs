//! The coordinator against a real etcd on loopback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smart_coord::{BladeState, Config, Coordinator, Member, Replaced};
use smart_testkit::etcd::Etcd;

const T: Duration = Duration::from_secs(3);

fn blades() -> Vec<(String, u64)> {
    (0..3).map(|i| (format!("127.0.0.1:{}", 7000 + i), (i as u64 + 1) << 20)).collect()
}

fn member() -> Member {
    Member { what: "test".into(), host: "here".into(), pid: std::process::id(), epoch: 0, fence_tag: 0, lease: 0 }
}

/// Waits up to `secs` for `f`.
fn within(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
fn one_of_two_proposals_from_an_epoch_wins() {
    let etcd = Etcd::start();
    let url = format!("{}/race", etcd.url);
    // Two compute blades create the configuration at once: one does.
    let created: Vec<(smart_coord::Versioned, bool)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| Coordinator::connect(&url, T).unwrap().create_or_load(&Config::new(&blades())).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(created.iter().filter(|(_, c)| *c).count(), 1, "{created:?}");
    assert_eq!(created[0].0, created[1].0);
    let (a, b) = (Coordinator::connect(&url, T).unwrap(), Coordinator::connect(&url, T).unwrap());
    let at = a.load().unwrap().unwrap();
    assert_eq!(at.config.epoch, 1);
    // Both propose from epoch 1, each without another blade: one wins, the
    // other reads the winner's.
    let (wa, wb) =
        (at.config.without(&[1], "a saw it fail").unwrap(), at.config.without(&[2], "b saw it fail").unwrap());
    let ra = a.replace(&at, &wa).unwrap();
    let rb = b.replace(&at, &wb).unwrap();
    let Replaced::Won(won) = ra else { panic!("{ra:?}") };
    assert_eq!(rb, Replaced::Lost(won.clone()));
    assert_eq!(won.config.epoch, 2);
    assert_eq!(won.config.blades[2].state, BladeState::Active);
    // The epoch never goes back.
    assert!(b.replace(&won, &at.config).is_err());
    // update() applies a change to what is stored, whatever came first.
    let v = b.update(|c| c.without(&[2], "b again").map(Some)).unwrap();
    assert_eq!((v.config.epoch, v.config.active()), (3, vec![0]));
    // Another cluster on the same etcd is another configuration.
    let other = Coordinator::connect(&format!("{}/other", etcd.url), T).unwrap();
    assert_eq!(other.load().unwrap(), None);
    assert_eq!(a.cluster(), "race");
}

#[test]
fn a_membership_halts_when_the_epoch_moves_or_its_lease_lapses_but_not_when_etcd_is_away() {
    let mut etcd = Etcd::start();
    let c = Coordinator::connect(&etcd.url, T).unwrap();
    let (v, created) = c.create_or_load(&Config::new(&blades())).unwrap();
    assert!(created);
    let ttl = Duration::from_secs(2);

    // A member is listed while it runs, and gone when it leaves.
    let halt = Arc::new(AtomicBool::new(false));
    let tag = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let m = c.join(&member(), ttl, v.config.epoch, halt.clone(), tag.clone()).unwrap();
    let listed = c.members().unwrap();
    assert_eq!((listed.len(), listed[0].lease, listed[0].epoch, listed[0].fence_tag), (1, m.lease(), 1, 0));
    // Its fence tag, once registered, is recorded.
    tag.store(42, Ordering::SeqCst);
    assert!(within(5, || c.members().unwrap()[0].fence_tag == 42), "{:?}", c.members());
    assert_eq!(c.fence_records().unwrap().iter().map(|m| m.fence_tag).collect::<Vec<_>>(), vec![42]);
    m.leave().unwrap();
    assert!(c.fence_records().unwrap().is_empty(), "a clean leave removes its fence tag");
    assert!(c.members().unwrap().is_empty());

    // etcd away for two times to live, then back: the member runs on.
    let halt = Arc::new(AtomicBool::new(false));
    let m = c.join(&member(), ttl, v.config.epoch, halt.clone(), Arc::default()).unwrap();
    etcd.kill();
    std::thread::sleep(2 * ttl + Duration::from_millis(500));
    assert!(!halt.load(Ordering::SeqCst), "halted while etcd was away: {:?}", m.why());
    etcd.restart();
    std::thread::sleep(2 * ttl);
    assert!(!halt.load(Ordering::SeqCst), "halted after etcd came back: {:?}", m.why());
    let c = Coordinator::connect(&etcd.url, T).unwrap();
    assert_eq!(c.members().unwrap().len(), 1, "its lease survived etcd's restart");

    // The configuration moves past its epoch: it halts, and says why.
    c.update(|cfg| cfg.without(&[2], "gone").map(Some)).unwrap();
    assert!(within(10, || halt.load(Ordering::SeqCst)), "no halt after the epoch moved");
    let why = m.why().unwrap();
    assert!(why.contains("moved to epoch 2") && why.contains("acted under epoch 1"), "{why}");
    drop(m);

    // Its lease revoked behind its back (as if it expired): it halts.
    let halt = Arc::new(AtomicBool::new(false));
    let m = c.join(&member(), ttl, 2, halt.clone(), Arc::new(std::sync::atomic::AtomicU64::new(7))).unwrap();
    assert!(within(5, || c.fence_records().unwrap().iter().any(|r| r.fence_tag == 7)));
    let status = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.url, "lease", "revoke", &format!("{:x}", m.lease())])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("etcdctl (Debian: etcd-client)");
    assert!(status.success());
    assert!(within(10, || halt.load(Ordering::SeqCst)), "no halt after the lease was revoked");
    assert!(m.why().unwrap().contains("lapse"), "{:?}", m.why());
    // A member that never left keeps its fence tag on record, its lease
    // gone: the next failover fences it.
    drop(m);
    assert!(within(5, || c.members().unwrap().is_empty()));
    assert!(c.fence_records().unwrap().iter().any(|r| r.fence_tag == 7));
}

#[test]
fn connecting_to_no_etcd_fails_in_time_and_says_where() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let t0 = Instant::now();
    let e = Coordinator::connect(&format!("http://127.0.0.1:{port}"), Duration::from_secs(1)).unwrap_err().to_string();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    let e = Coordinator::connect("127.0.0.1:2379", T).unwrap_err().to_string();
    assert!(e.contains("not an http:// URL"), "{e}");
}

#[test]
fn a_fence_tag_is_not_recorded_once_the_epoch_moved_past_its_member() {
    let etcd = Etcd::start();
    let c = Coordinator::connect(&format!("{}/late", etcd.url), T).unwrap();
    let (v, _) = c.create_or_load(&Config::new(&blades())).unwrap();
    let (halt, tag) = (Arc::new(AtomicBool::new(false)), Arc::new(std::sync::atomic::AtomicU64::new(0)));
    let m = c.join(&member(), Duration::from_secs(2), v.config.epoch, halt.clone(), tag.clone()).unwrap();
    // The next epoch is made (and its fencing reads the tags) before this
    // member of epoch 1 registered: its tag, set now, is not recorded, and
    // it halts at once.
    c.update(|cfg| cfg.without(&[2], "gone").map(Some)).unwrap();
    tag.store(9, Ordering::SeqCst);
    assert!(within(5, || halt.load(Ordering::SeqCst)), "no halt");
    let why = m.why().unwrap();
    // (Its epoch check, a period later, says that the epoch moved.)
    assert!(why.contains("fence tag was recorded") || why.contains("moved to epoch 2"), "{why}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(m.recorded_tag().load(Ordering::SeqCst), 0);
    assert!(c.fence_records().unwrap().is_empty(), "{:?}", c.fence_records());
    // A member of the current epoch records its tag.
    let m2 = c.join(&member(), Duration::from_secs(2), 2, Arc::default(), Arc::new(7.into())).unwrap();
    assert!(within(5, || m2.recorded_tag().load(Ordering::SeqCst) == 7));
    assert_eq!(c.fence_records().unwrap().iter().map(|r| r.fence_tag).collect::<Vec<_>>(), vec![7]);
}

/// An etcd cluster of three members, all named in the URL: with any one of
/// them killed, a membership runs on (its keep-alives reach the others),
/// the configuration is read and a proposal wins; with two killed (no
/// quorum), a proposal fails within its time-out and says so, and the
/// membership, which cannot tell that from a coordinator away, runs on.
#[test]
fn a_coordinator_of_several_etcd_members_outlives_any_one_of_them() {
    let mut cluster = Etcd::cluster(3);
    let url = format!("{}/ha", Etcd::urls(&cluster));
    let c = Coordinator::connect(&url, T).unwrap();
    assert_eq!(c.url(), Etcd::urls(&cluster));
    let (v, _) = c.create_or_load(&Config::new(&blades())).unwrap();
    // Longer than the shortest (2 s): an election under a loaded machine
    // may take a second or two of it.
    let ttl = Duration::from_secs(4);
    let halt = Arc::new(AtomicBool::new(false));
    let m = c.join(&member(), ttl, v.config.epoch, halt.clone(), Arc::default()).unwrap();
    let mut epoch = v.config.epoch;
    for (i, member) in cluster.iter_mut().enumerate() {
        member.kill();
        // Past a lease length with member i down: the lease was kept alive.
        std::thread::sleep(ttl + Duration::from_millis(1500));
        assert!(!halt.load(Ordering::SeqCst), "halted with member {i} down: {:?}", m.why());
        assert_eq!(c.members().unwrap().len(), 1, "member {i} down");
        let now = c.load().unwrap().unwrap();
        assert_eq!(now.config.epoch, epoch);
        let fresh = Coordinator::connect(&url, T).unwrap();
        assert_eq!(fresh.load().unwrap().unwrap().config.epoch, epoch, "a new client with member {i} down");
        member.restart();
    }
    // A proposal with one member down wins.
    cluster[1].kill();
    let won = c.update(|cfg| cfg.without(&[2], "gone").map(Some)).unwrap();
    epoch += 1;
    assert_eq!(won.config.epoch, epoch);
    assert!(within(10, || halt.load(Ordering::SeqCst)), "the member of epoch 1 halts once the epoch moved");
    drop(m);
    // No quorum: a proposal fails in time, naming the coordinator.
    cluster[2].kill();
    let t0 = Instant::now();
    let e = c.update(|cfg| cfg.without(&[1], "gone").map(Some)).unwrap_err().to_string();
    assert!(t0.elapsed() < 3 * T, "{:?}", t0.elapsed());
    assert!(e.contains(&Etcd::urls(&cluster)), "{e}");
}

#[test]
fn of_several_claims_of_a_task_one_wins() {
    let etcd = Etcd::start();
    let c = Coordinator::connect(&format!("{}/claims", etcd.url), T).unwrap();
    let won: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let url = format!("{}/claims", etcd.url);
                s.spawn(move || Coordinator::connect(&url, T).unwrap().claim("copy-2@3", &format!("c{i}")).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    assert!(!c.claim("copy-2@3", "late").unwrap(), "claimed already");
    assert!(c.claim("copy-2@4", "late").unwrap(), "another task");
}
