//! The TCP memory blade: hostile peers, version mismatch, restarts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use smart_core::backend::tcp::handshake;
use smart_core::blade::BladeServer;
use smart_core::region::Region;
use smart_core::wire::{self, Header, WrDesc};
use smart_core::{Error, Runtime, RuntimeConfig, TcpTransport, Transport};

fn serve(region: Region) -> smart_core::blade::BladeHandle {
    BladeServer::bind("127.0.0.1:0", Arc::new(region)).unwrap().spawn().unwrap()
}

/// Whether the blade closed `s` (reads EOF or a reset within 5 s).
fn closed(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

fn frame(h: Header, descs: &[WrDesc], payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    h.put(&mut v);
    for d in descs {
        d.put(&mut v);
    }
    v.extend_from_slice(payload);
    v
}

#[test]
fn blade_survives_hostile_peers_and_keeps_serving() {
    let h = serve(Region::anonymous(1 << 20).unwrap());
    let addr = h.addr().to_string();
    let t = TcpTransport::connect(std::slice::from_ref(&addr)).unwrap();
    // A healthy client connected before the attacks.
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let a = rt.block_on({
        let ctx = ctx.clone();
        async move { ctx.alloc(0, 64, 8).await.unwrap() }
    });
    let rkey = t.blades()[0].rkey;
    // 1. Garbage instead of a greeting.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed(s), "garbage greeting");
    // 2. A huge length field after a valid handshake.
    let (mut s, _) = handshake(&addr, wire::PROTOCOL_VERSION).unwrap();
    s.write_all(&frame(Header { len: u32::MAX, kind: wire::KIND_BATCH, count: 1, wr_id: 1 }, &[], &[])).unwrap();
    assert!(closed(s), "huge length");
    // 3. A truncated frame, then the peer hangs up.
    let (mut s, _) = handshake(&addr, wire::PROTOCOL_VERSION).unwrap();
    let d = WrDesc { op: 2, rkey, remote: a.offset(), len: 64, compare_add: 0, swap: 0 };
    let f = frame(
        Header { len: (wire::WR_DESC_LEN + 64) as u32, kind: wire::KIND_BATCH, count: 1, wr_id: 1 },
        &[d],
        &[7; 64],
    );
    s.write_all(&f[..f.len() - 10]).unwrap();
    drop(s);
    // 4. A frame whose WR count does not match its body, and a WRITE whose
    //    payload runs past the frame: closed, and nothing was written.
    for bad in [
        frame(Header { len: wire::WR_DESC_LEN as u32, kind: wire::KIND_BATCH, count: 2, wr_id: 1 }, &[d], &[]),
        frame(
            Header { len: (wire::WR_DESC_LEN + 8) as u32, kind: wire::KIND_BATCH, count: 1, wr_id: 1 },
            &[d],
            &[9; 8],
        ),
        frame(Header { len: 0, kind: 77, count: 0, wr_id: 1 }, &[], &[]),
    ] {
        let (mut s, _) = handshake(&addr, wire::PROTOCOL_VERSION).unwrap();
        s.write_all(&bad).unwrap();
        assert!(closed(s), "malformed frame");
    }
    // 5. Random bytes after a valid handshake.
    let (mut s, _) = handshake(&addr, wire::PROTOCOL_VERSION).unwrap();
    let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let _ = s.write_all(&junk);
    assert!(closed(s), "junk frames");
    // The old client and a new one still work, and no attack wrote anything.
    let v = rt.block_on(async move {
        let mut buf = [0u8; 64];
        ctx.read(a, &mut buf).await.unwrap();
        assert_eq!(buf, [0; 64], "a rejected frame must not execute any WR");
        ctx.faa(a, 1).await.unwrap();
        ctx.read_u64(a).await.unwrap()
    });
    assert_eq!(v, 1);
    let t2 = TcpTransport::connect(&[addr]).unwrap();
    let mut rt2 = Runtime::new(&t2, 0, RuntimeConfig::default()).unwrap();
    let ctx2 = rt2.ctx();
    assert_eq!(rt2.block_on(async move { ctx2.faa(a, 1).await.unwrap() }), 1);
}

#[test]
fn handshake_rejects_other_versions_and_non_blades() {
    let h = serve(Region::anonymous(1 << 20).unwrap());
    let addr = h.addr().to_string();
    let e = handshake(&addr, wire::PROTOCOL_VERSION + 1).unwrap_err();
    assert!(matches!(&e, Error::Handshake { reason, .. } if reason.contains("version mismatch")), "{e}");
    // A listener that is not a memory blade: answers with something else.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = l.local_addr().unwrap().to_string();
    let srv = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 16];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").unwrap();
    });
    let e = TcpTransport::connect(&[other]).unwrap_err();
    assert!(e.to_string().contains("not a Smart-rs memory blade"), "{e}");
    srv.join().unwrap();
    // Nothing listening: a clear I/O error, quickly.
    let e = TcpTransport::connect(&["127.0.0.1:1".to_string()]).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

#[test]
fn restarted_blade_on_the_same_backing_file_keeps_the_data() {
    let path = std::env::temp_dir().join(format!("smart-it-backing-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let a = {
        let region = Region::file_backed(&path, Some(4 << 20)).unwrap();
        let h = serve(region);
        let t = TcpTransport::connect(&[h.addr().to_string()]).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        let p = payload.clone();
        rt.block_on(async move {
            let a = ctx.alloc(0, 3000, 64).await.unwrap();
            ctx.write(a, &p).await.unwrap();
            ctx.set_root(0, "it", a).await.unwrap();
            a
        })
        // The handle drops here: the server stops; the mapping is released.
    };
    let h = serve(Region::file_backed(&path, None).unwrap());
    let t = TcpTransport::connect(&[h.addr().to_string()]).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let (root, back, fresh) = rt.block_on(async move {
        ctx.check_blade(0).await.unwrap();
        let root = ctx.root(0, "it").await.unwrap();
        let mut back = vec![0u8; 3000];
        ctx.read(a, &mut back).await.unwrap();
        // The heap pointer survived too: new allocations do not overlap.
        let fresh = ctx.alloc(0, 64, 8).await.unwrap();
        (root, back, fresh)
    });
    assert_eq!(root, Some(a));
    assert_eq!(back, payload);
    assert!(fresh.offset() >= a.offset() + 3000);
    drop(h);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_verbs_client_is_told_that_the_blade_serves_tcp_only() {
    use smart_core::backend::tcp::handshake_with;
    use smart_core::wire::conn::FLAG_VERBS;
    let h = serve(Region::anonymous(1 << 20).unwrap());
    let e = handshake_with(&h.addr().to_string(), wire::PROTOCOL_VERSION, FLAG_VERBS).unwrap_err();
    assert!(e.to_string().contains("--transport verbs"), "{e}");
    // And the blade still serves TCP clients.
    assert!(handshake(&h.addr().to_string(), wire::PROTOCOL_VERSION).is_ok());
}

#[test]
fn a_greeting_that_trickles_in_is_cut_off_by_the_handshake_deadline() {
    // One byte every 300 ms would take 4.8 s for the 16-byte greeting; the
    // deadline bounds the whole handshake (1 s here), not each read.
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let server = BladeServer::bind("127.0.0.1:0", region).unwrap().with_handshake_timeout(Duration::from_secs(1));
    let blade = server.spawn().unwrap();
    let mut s = TcpStream::connect(blade.addr()).unwrap();
    let hello = wire::hello(wire::PROTOCOL_VERSION);
    let mut cut = false;
    for b in hello {
        if s.write_all(&[b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // Whether or not the last writes still went out, no welcome comes.
    let mut w = [0u8; wire::WELCOME_LEN];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let welcomed = s.read_exact(&mut w).is_ok();
    assert!(cut || !welcomed, "a greeting trickled over 4.8 s was answered");
    assert!(!welcomed);
}

#[test]
fn connections_beyond_the_maximum_are_refused_with_a_reason() {
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let blade = BladeServer::bind("127.0.0.1:0", region).unwrap().with_max_connections(2).spawn().unwrap();
    let peer = blade.addr().to_string();
    let a = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    let b = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    let e = handshake(&peer, wire::PROTOCOL_VERSION).unwrap_err();
    assert!(e.to_string().contains("maximum number of connections"), "{e}");
    // Closing one makes room again.
    drop(a);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match handshake(&peer, wire::PROTOCOL_VERSION) {
            Ok(_) => break,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no room after a close: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    drop(b);
}

/// Connections that complete the handshake and then send nothing, or only
/// part of a frame, cannot keep clients out: they are closed after the
/// idle time-out (no first request) or the handshake time-out (half a
/// frame), and a real client then gets in; a connection in use is kept
/// however long it pauses.
#[test]
fn idle_and_half_frame_connections_are_closed_and_a_real_client_gets_in() {
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let blade = BladeServer::bind("127.0.0.1:0", region)
        .unwrap()
        .with_max_connections(3)
        .with_idle_timeout(Duration::from_millis(600))
        .with_handshake_timeout(Duration::from_millis(600))
        .spawn()
        .unwrap();
    let peer = blade.addr().to_string();
    // A client in use: one READ, then a pause longer than both time-outs.
    let t = TcpTransport::connect(std::slice::from_ref(&peer)).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let at = smart_core::GlobalAddr::new(0, 4096);
    let c = ctx.clone();
    rt.block_on(async move { c.read_u64(at).await.unwrap() });
    // Two idle connections, and one that sends 5 bytes of a frame.
    let (idle, _) = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    let (half, _) = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    let e = handshake(&peer, wire::PROTOCOL_VERSION).unwrap_err();
    assert!(e.to_string().contains("maximum number of connections"), "{e}");
    (&half).write_all(&[1, 2, 3, 4, 5]).unwrap();
    let start = std::time::Instant::now();
    assert!(closed(idle) && closed(half), "idle connections were kept");
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    // The client in use was kept through its pause; a new one gets in.
    std::thread::sleep(Duration::from_millis(700));
    let c = ctx.clone();
    rt.block_on(async move { c.read_u64(at).await.unwrap() });
    assert!(handshake(&peer, wire::PROTOCOL_VERSION).is_ok());
}

/// The set check over three embedded blades whose superblocks the test
/// edits as a restart, a reordering or another set would leave them.
#[test]
fn blades_of_a_set_are_checked_in_order_and_a_refused_list_changes_nothing() {
    use smart_core::layout::{set_place, OFF_IDENTITY, OFF_SET_NEXT, OFF_SET_PLACE};
    use smart_core::EmbeddedTransport;

    let t = EmbeddedTransport::new(3, 1 << 20).unwrap();
    let word = |b: usize, off: u64| t.region(b).load_u64(off).unwrap();
    let id: Vec<u64> = (0..3).map(|b| word(b, OFF_IDENTITY)).collect();
    assert!(id.iter().all(|i| i >> 16 != 0) && id[0] != id[1] && id[1] != id[2], "{id:x?}");
    let check = || {
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move { ctx.check_blade_set().await })
    };
    let words = |b: usize| (word(b, OFF_SET_PLACE), word(b, OFF_SET_NEXT));
    // First use records the set; a second finds it as recorded.
    for _ in 0..2 {
        check().unwrap();
        assert_eq!(words(0), (set_place(id[0], 0), id[1]));
        assert_eq!(words(1), (set_place(id[0], 1), id[2]));
        assert_eq!(words(2), (set_place(id[0], 2), 0));
    }
    let refused = |blade: u16, says: &str| match check() {
        Err(Error::BladeSet { blade: b, what }) => {
            assert_eq!(b, blade, "{what}");
            assert!(what.contains(says), "{what}");
        }
        other => panic!("expected blade {blade} refused ({says}), got {other:?}"),
    };
    let put = |b: usize, off: u64, v: u64| t.region(b).store_u64(off, v).unwrap();

    // Blade 2 restarted without its backing file: a new identity, no set.
    put(2, OFF_IDENTITY, id[2] ^ 0xffff_0000);
    put(2, OFF_SET_PLACE, 0);
    refused(2, "restarted without its backing file");
    assert_eq!(words(2), (0, 0), "a refused list wrote its set on the new blade");
    put(2, OFF_IDENTITY, id[2]);
    put(2, OFF_SET_PLACE, set_place(id[0], 2));
    check().unwrap();

    // Blades 0 and 1 swapped in the list: each superblock as the other's.
    let sb = |b: usize| [OFF_IDENTITY, OFF_SET_PLACE, OFF_SET_NEXT].map(|o| word(b, o));
    let (s0, s1) = (sb(0), sb(1));
    let swap = |a: [u64; 3], b: [u64; 3]| {
        for (i, o) in [OFF_IDENTITY, OFF_SET_PLACE, OFF_SET_NEXT].into_iter().enumerate() {
            put(0, o, a[i]);
            put(1, o, b[i]);
        }
    };
    swap(s1, s0);
    refused(0, "listed in another order");
    swap(s0, s1);
    check().unwrap();

    // Blade 1 from another set (whose blade 0 is not here).
    put(1, OFF_SET_PLACE, set_place(0x5eed_0000_0000_0000, 1));
    refused(1, "another set");
    put(1, OFF_SET_PLACE, set_place(id[0], 1));

    // Blade 2 serving a copy of blade 0's backing file.
    put(2, OFF_IDENTITY, id[0]);
    refused(2, "has the identity of memory blade 0");
    put(2, OFF_IDENTITY, id[2]);
    check().unwrap();

    // A superblock without an identity is damage, not a fresh blade.
    put(1, OFF_IDENTITY, 0);
    assert!(matches!(check(), Err(Error::Damaged { blade: 1, .. })));
}

/// A 32 MiB tmpfs mounted for a test, unmounted (and its directory removed)
/// when dropped.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount() -> SmallFs {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts a tmpfs: run it as root");
        let dir = std::env::temp_dir().join(format!("smart-smallfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t tmpfs failed");
        SmallFs(dir)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A backing file reserves its disk space when opened: on a file system
/// without room, the blade refuses to start (before, it started, and died of
/// SIGBUS when a write first touched a page the disk could not hold).
#[test]
#[ignore = "mounts a 32 MiB tmpfs, so needs root; .ci/run runs it"]
fn a_backing_file_without_room_on_its_disk_is_refused_at_start() {
    let fs = SmallFs::mount();
    let path = fs.0.join("blade.img");
    let e = Region::file_backed(&path, Some(128 << 20)).expect_err("128 MiB on a 32 MiB file system");
    assert!(e.to_string().contains("cannot reserve its 134217728 bytes"), "{e}");
    assert!(!path.exists(), "the file it could not fill is not left behind");
    // A blade that fits is written in full, every page, and survives.
    let r = Region::file_backed(&path, Some(16 << 20)).unwrap();
    for off in (0..16 << 20).step_by(4096) {
        r.store_u64(off, off + 1).unwrap();
    }
    r.flush().unwrap();
    drop(r);
    // A second file now finds the rest of the room taken: refused, and the
    // first reopens with its data.
    let e = Region::file_backed(&fs.0.join("second.img"), Some(20 << 20)).expect_err("only 16 MiB left");
    assert!(e.to_string().contains("cannot reserve"), "{e}");
    let r = Region::file_backed(&path, None).unwrap();
    assert_eq!(r.load_u64(8192), Ok(8193));
}

/// A durable blade whose file's sync once failed answers no WRITE, CAS or
/// FAA again (the kernel reports a lost write-back once, so no later sync
/// proves anything), and still answers READs, which need no sync.
#[test]
fn a_durable_blade_answers_no_write_after_a_failed_sync() {
    let path = std::env::current_dir().unwrap().join(format!("durable-poison-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let region = Arc::new(Region::file_backed(&path, Some(1 << 20)).unwrap());
    let h = BladeServer::bind("127.0.0.1:0", region.clone()).unwrap().with_durable().unwrap().spawn().unwrap();
    let addr = h.addr().to_string();
    let at = smart_core::GlobalAddr::new(0, 1 << 19);
    // Each on a connection of its own: a failed answer closes its connection.
    let write = || {
        let t = TcpTransport::connect(std::slice::from_ref(&addr)).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move { ctx.write(at, &7u64.to_le_bytes()).await })
    };
    let read = || {
        let t = TcpTransport::connect(std::slice::from_ref(&addr)).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let mut b = [0u8; 8];
            ctx.read(at, &mut b).await.map(|()| u64::from_le_bytes(b))
        })
    };
    write().expect("a WRITE before any failure");
    region.fail_syncs();
    let t0 = std::time::Instant::now();
    let err = write().expect_err("a WRITE answered after a failed sync");
    assert!(t0.elapsed() < Duration::from_secs(5), "the refusal took {:?}", t0.elapsed());
    eprintln!("after a failed sync, a WRITE: {err}");
    assert_eq!(read().expect("READs need no sync"), 7);
    drop(h);
    drop(region);
    std::fs::remove_file(&path).unwrap();
}

/// A stopped blade lets its backing file go before its handle's drop
/// returns, even with clients still connected: a blade restarted on the
/// file at once finds it free (the Soft-RoCE suite once found the file
/// "in use by another memory-blade" on a restart).
#[test]
fn a_dropped_blade_releases_its_backing_file_before_the_drop_returns() {
    let file = std::env::temp_dir().join(format!("smart-blade-release-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&file);
    for round in 0..3 {
        let size = (round == 0).then_some(4 << 20);
        let region = Arc::new(Region::file_backed(&file, size).unwrap_or_else(|e| panic!("round {round}: {e}")));
        let h = BladeServer::bind("127.0.0.1:0", region).unwrap().spawn().unwrap();
        let t = TcpTransport::connect(&[h.addr().to_string()]).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move { ctx.read_u64(smart_core::GlobalAddr::new(0, 4096)).await.unwrap() });
        // The client stays connected while the blade stops.
        drop(h);
        drop((rt, t));
    }
    std::fs::remove_file(&file).unwrap();
}

/// A TCP connection to `to` from the local address `from` (any address of
/// 127.0.0.0/8 is this host's).
fn connect_from(from: std::net::Ipv4Addr, to: std::net::SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(to) = to else { panic!("IPv4 only") };
    let sa = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, bound and connected with valid, sized
    // addresses; its descriptor is handed to the TcpStream, which owns it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let (src, dst) = (sa(from, 0), sa(*to.ip(), to.port()));
        assert_eq!(libc::bind(fd, (&raw const src).cast(), len), 0, "bind: {}", std::io::Error::last_os_error());
        assert_eq!(libc::connect(fd, (&raw const dst).cast(), len), 0, "{}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// The welcome's status for a greeting sent on `s`.
fn welcome_status(s: &mut TcpStream) -> u32 {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&wire::hello(wire::PROTOCOL_VERSION)).unwrap();
    let mut w = [0u8; wire::WELCOME_LEN];
    s.read_exact(&mut w).unwrap();
    wire::Welcome::decode(&w).unwrap().status
}

/// One peer (one IP address) cannot take every connection: past its share
/// it is refused, and another peer still gets in.
#[test]
fn one_peer_cannot_take_every_connection() {
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let server = BladeServer::bind("127.0.0.1:0", region).unwrap().with_max_connections(80);
    assert_eq!(server.max_per_peer(), 80 - smart_core::blade::ROOM_FOR_OTHERS, "the default share");
    let blade = server.with_max_per_peer(10).spawn().unwrap();
    let (one, other) = (std::net::Ipv4Addr::new(127, 0, 0, 1), std::net::Ipv4Addr::new(127, 0, 0, 2));
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..10 {
        let mut s = connect_from(one, blade.addr());
        assert_eq!(welcome_status(&mut s), wire::STATUS_OK);
        held.push(s);
    }
    let mut s = connect_from(one, blade.addr());
    assert_eq!(welcome_status(&mut s), wire::STATUS_FULL, "the eleventh from one peer is refused");
    let mut s = connect_from(other, blade.addr());
    assert_eq!(welcome_status(&mut s), wire::STATUS_OK, "another peer gets in");
    // A connection of the first peer that ends gives its share back.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while welcome_status(&mut connect_from(one, blade.addr())) != wire::STATUS_OK {
        assert!(std::time::Instant::now() < deadline, "no room after a close");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_transport_without_an_absent_blade_runs_on_the_others() {
    let (h0, h1) = (serve(Region::anonymous(1 << 20).unwrap()), serve(Region::anonymous(1 << 20).unwrap()));
    let addrs = vec![h0.addr().to_string(), h1.addr().to_string()];
    let whole = TcpTransport::connect(&addrs).unwrap();
    let info = whole.blades()[1];
    drop(whole);
    // Blade 1 is gone: no connection to it is tried.
    drop(h1);
    assert!(TcpTransport::connect(&addrs).is_err());
    let t = TcpTransport::connect_without(&addrs, None, &[(1, Some(info), "removed at epoch 2".into())]).unwrap();
    assert_eq!(t.blades()[1], info, "the absent blade keeps its place and size");
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let a = ctx.alloc(0, 64, 8).await.unwrap();
        ctx.write(a, &7u64.to_le_bytes()).await.unwrap();
        assert_eq!(ctx.read_u64(a).await.unwrap(), 7);
        // A verb to the absent blade fails at once, however often.
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            let e = ctx.read_u64(smart_core::GlobalAddr::new(1, 4096)).await.unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(1), "{e}");
        }
        assert_eq!(ctx.read_u64(a).await.unwrap(), 7, "the other blade still answers");
    });
    // Unknown, an absent blade's size is the largest other blade's.
    let t = TcpTransport::connect_without(&addrs, None, &[(1, None, "removed".into())]).unwrap();
    assert_eq!(t.blades()[1].size, t.blades()[0].size);
    // An index past the blades is refused.
    assert!(TcpTransport::connect_without(&addrs, None, &[(2, Some(info), "x".into())]).is_err());
}
