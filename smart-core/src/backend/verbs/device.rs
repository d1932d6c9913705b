//! Choosing the device, port and GID, without a device.

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    InfiniBand,
    /// RoCE (Ethernet): addressed by GID.
    Ethernet,
}

impl LinkLayer {
    /// From `ibv_port_attr::link_layer` (0 unspecified = InfiniBand).
    pub fn from_raw(v: u8) -> LinkLayer {
        if v == 2 {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        }
    }
}

/// What was found about one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortDesc {
    /// Port number (from 1).
    pub num: u8,
    /// Whether it is ACTIVE.
    pub active: bool,
    /// Its link layer.
    pub link: LinkLayer,
    /// Entries in its GID table.
    pub gids: u32,
}

/// What was found about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDesc {
    /// Its name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Its ports.
    pub ports: Vec<PortDesc>,
}

/// Picks `(device index, port)`: the named device (or the first with an
/// active port) and its first active port.
///
/// # Errors
/// A message naming what exists, when nothing fits.
pub fn choose(devices: &[DeviceDesc], want: Option<&str>) -> Result<(usize, u8), String> {
    if devices.is_empty() {
        return Err(super::NO_DEVICE_HELP.to_string());
    }
    let names = || devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ");
    let candidates: Vec<usize> = match want {
        Some(w) => match devices.iter().position(|d| d.name == w) {
            Some(i) => vec![i],
            None => return Err(format!("no RDMA device {w:?}; found: {}", names())),
        },
        None => (0..devices.len()).collect(),
    };
    for i in candidates {
        if let Some(p) = devices[i].ports.iter().find(|p| p.active) {
            return Ok((i, p.num));
        }
    }
    Err(format!(
        "no active port on {}; bring a link up (`ibv_devinfo` shows port states)",
        want.map_or_else(names, str::to_string)
    ))
}

/// The GID index to use: InfiniBand needs none unless asked (LIDs route);
/// RoCE needs one, by default 0. On RoCE v2 with IPv4 it is often another
/// index (see `show_gids`), which `--gid-index` selects.
///
/// # Errors
/// If the index is beyond the port's table.
pub fn gid_index(port: &PortDesc, requested: Option<u32>) -> Result<Option<u32>, String> {
    let idx = match (port.link, requested) {
        (_, Some(i)) => Some(i),
        (LinkLayer::Ethernet, None) => Some(0),
        (LinkLayer::InfiniBand, None) => None,
    };
    match idx {
        Some(i) if i >= port.gids => Err(format!("GID index {i} is beyond the port's {} GIDs", port.gids)),
        other => Ok(other),
    }
}

/// Whether a GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), the
/// form RoCE v2 over IPv4 uses.
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The local GID a RoCE QP towards `remote` uses: both ends of a RoCE v2
/// path must be of one family (IPv4-mapped or IPv6), so a memory blade
/// answers each client from a GID of the client's family, preferring the
/// configured index. `table` lists the port's non-zero GIDs with their
/// indexes. `None` if the port has no GID of that family.
pub fn matching_gid(table: &[(u32, [u8; 16])], preferred: u32, remote: &[u8; 16]) -> Option<(u32, [u8; 16])> {
    let family = is_ipv4_mapped(remote);
    let fits = |g: &&(u32, [u8; 16])| is_ipv4_mapped(&g.1) == family;
    table.iter().filter(fits).find(|g| g.0 == preferred).or_else(|| table.iter().find(fits)).copied()
}

/// What `compute-blade verbs-info` reports about one device (see
/// `probe`, feature `verbs`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceReport {
    /// Its name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Its ports: number, state, link layer, and the non-zero GIDs.
    pub ports: Vec<PortReport>,
    /// Most QPs, CQs and WRs per QP, and the largest memory region.
    pub max_qp: u64,
    /// Most CQs.
    pub max_cq: u64,
    /// Most WRs per send queue.
    pub max_qp_wr: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Whether it does remote atomics (CAS, FAA) at all.
    pub atomics: bool,
    /// Whether its provider has thread domains (`ibv_alloc_td`): without
    /// them, `per-thread-db` gets its doorbells from the order QPs are
    /// created in, not from the provider.
    pub thread_domains: bool,
}

/// One port of a [`DeviceReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PortReport {
    /// Port number (from 1).
    pub num: u8,
    /// Whether it is ACTIVE.
    pub active: bool,
    /// Its link layer.
    pub link: LinkLayer,
    /// Entries in its GID table.
    pub gid_table: u32,
    /// Its non-zero GIDs: index and address (IPv6 notation).
    pub gids: Vec<(u32, String)>,
}

/// A GID in IPv6 notation (`::ffff:10.0.0.1` for an IPv4-mapped one).
pub fn gid_text(gid: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

impl DeviceReport {
    /// What [`choose`] needs of it.
    pub fn desc(&self) -> DeviceDesc {
        DeviceDesc {
            name: self.name.clone(),
            ports: self
                .ports
                .iter()
                .map(|p| PortDesc { num: p.num, active: p.active, link: p.link, gids: p.gid_table })
                .collect(),
        }
    }

    /// The report as lines of text, for a person.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{}: max {} QPs, {} CQs, {} WRs per QP, {} bytes per MR; atomics {}; thread domains {}\n",
            self.name,
            self.max_qp,
            self.max_cq,
            self.max_qp_wr,
            self.max_mr_size,
            if self.atomics { "yes" } else { "NO (CAS and FAA fail)" },
            if self.thread_domains { "yes" } else { "no (per-thread-db binds doorbells by QP creation order instead)" }
        );
        for p in &self.ports {
            out += &format!(
                "  port {}: {}, {:?}, {} GID entries{}\n",
                p.num,
                if p.active { "ACTIVE" } else { "not active" },
                p.link,
                p.gid_table,
                if p.gids.is_empty() { ", none set" } else { "" }
            );
            for (i, g) in &p.gids {
                out += &format!("    GID {i}: {g}\n");
            }
        }
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn dev(name: &str, active: &[bool], link: LinkLayer) -> DeviceDesc {
        DeviceDesc {
            name: name.into(),
            ports: active
                .iter()
                .enumerate()
                .map(|(i, a)| PortDesc { num: i as u8 + 1, active: *a, link, gids: 4 })
                .collect(),
        }
    }

    #[test]
    fn picks_named_or_first_active() {
        let devs = [dev("mlx5_0", &[false, true], LinkLayer::InfiniBand), dev("rxe0", &[true], LinkLayer::Ethernet)];
        assert_eq!(choose(&devs, None), Ok((0, 2)));
        assert_eq!(choose(&devs, Some("rxe0")), Ok((1, 1)));
        assert!(choose(&devs, Some("mlx5_9")).unwrap_err().contains("found: mlx5_0, rxe0"));
        assert!(choose(&[dev("x", &[false], LinkLayer::Ethernet)], None).unwrap_err().contains("no active port"));
        assert!(choose(&[], None).unwrap_err().contains("rdma link add"));
    }

    #[test]
    fn gid_index_depends_on_the_link_layer() {
        let ib = PortDesc { num: 1, active: true, link: LinkLayer::InfiniBand, gids: 8 };
        let roce = PortDesc { link: LinkLayer::Ethernet, ..ib.clone() };
        assert_eq!(gid_index(&ib, None), Ok(None));
        assert_eq!(gid_index(&roce, None), Ok(Some(0)));
        assert_eq!(gid_index(&roce, Some(3)), Ok(Some(3)));
        assert!(gid_index(&roce, Some(8)).unwrap_err().contains("beyond"));
        assert_eq!(LinkLayer::from_raw(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_raw(1), LinkLayer::InfiniBand);
    }

    #[test]
    fn a_device_report_reads_as_text() {
        let mut v4 = [0u8; 16];
        v4[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 2, 15]);
        let r = DeviceReport {
            name: "rxe0".into(),
            ports: vec![PortReport {
                num: 1,
                active: true,
                link: LinkLayer::Ethernet,
                gid_table: 1024,
                gids: vec![(1, gid_text(&v4))],
            }],
            max_qp: 1 << 20,
            max_cq: 1 << 14,
            max_qp_wr: 1 << 15,
            max_mr_size: u64::MAX,
            atomics: true,
            thread_domains: false,
        };
        let t = r.text();
        assert!(t.starts_with("rxe0: max 1048576 QPs, 16384 CQs, 32768 WRs per QP"), "{t}");
        assert!(t.contains("atomics yes; thread domains no (per-thread-db binds"), "{t}");
        assert!(t.contains("  port 1: ACTIVE, Ethernet, 1024 GID entries\n    GID 1: ::ffff:10.0.2.15\n"), "{t}");
        assert_eq!(choose(&[r.desc()], Some("rxe0")), Ok((0, 1)));
    }

    #[test]
    fn a_blade_answers_from_a_gid_of_the_clients_family() {
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[15] = 7;
        let mut v4 = [0u8; 16];
        v4[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        let mut v4b = v4;
        v4b[15] = 2;
        assert!(is_ipv4_mapped(&v4) && !is_ipv4_mapped(&link_local));
        let table = [(0, link_local), (1, v4), (3, v4b)];
        assert_eq!(matching_gid(&table, 0, &v4), Some((1, v4)), "an IPv4 client gets the first IPv4 GID");
        assert_eq!(matching_gid(&table, 3, &v4), Some((3, v4b)), "the configured index when it fits");
        assert_eq!(matching_gid(&table, 1, &link_local), Some((0, link_local)), "an IPv6 client gets an IPv6 GID");
        assert_eq!(matching_gid(&table[1..], 1, &link_local), None, "no GID of that family");
    }
}
