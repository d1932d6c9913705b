//! Choosing the device, port and GID, without a device.

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}
