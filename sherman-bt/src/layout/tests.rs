use super::*;

/// (page, first entry line, leaf entry bytes, lines per leaf entry, leaf
/// entries, internal entries).
type Pin = (usize, usize, usize, usize, usize, usize);

/// (key, value) → what the layout must be.
const PINS: [((usize, usize), Pin); 6] = [
    ((8, 8), (1024, 1, 20, 1, 30, 45)),
    ((24, 100), (4096, 2, 128, 3, 20, 62)),
    ((24, 1000), (2048, 2, 36, 1, 30, 30)),
    ((64, 1000), (4096, 3, 76, 2, 30, 30)),
    ((256, 1024), (8192, 10, 268, 5, 23, 23)),
    ((256, 128), (8192, 10, 388, 7, 16, 23)),
];

#[test]
fn the_layout_is_pinned_for_several_sizes() {
    for ((k, v), (page, first, bytes, lines, leaf, internal)) in PINS {
        let f = Format::new(k, v).unwrap();
        assert_eq!(
            (f.page, f.first, f.leaf.bytes, f.leaf.lines, f.leaf.count, f.internal.count),
            (page, first, bytes, lines, leaf, internal),
            "{k}/{v}"
        );
        // Every entry inside the page, none overlapping the next, and an
        // entry spans exactly the lines the speculative read takes.
        for level in [0u8, 1] {
            let s = f.slots(level);
            for i in 0..s.count {
                let a = f.entry_at(level, i);
                assert!(a >= f.first * PAYLOAD, "{k}/{v}: entry {i} in the header");
                assert!(at(a + s.bytes - 1) < f.page, "{k}/{v}: entry {i} past the page");
                if i + 1 < s.count {
                    assert!(a + s.bytes <= f.entry_at(level, i + 1), "{k}/{v}: entries {i} and {} overlap", i + 1);
                }
                if level == 0 {
                    let (l, n) = f.leaf_entry_lines(i);
                    assert_eq!(l, a / PAYLOAD);
                    assert!((a + s.bytes - 1) / PAYLOAD < l + n, "{k}/{v}: entry {i} leaves its lines");
                }
            }
        }
    }
    // The paper's setting: entry 0 at line 1, two per line.
    let f = Format::paper();
    assert_eq!((at(f.entry_at(0, 0)), at(f.entry_at(0, 1)), at(f.entry_at(0, 2))), (72, 92, 136));
    assert_eq!((MAX_BLADES, FORMAT_WORD, NAME_WORD), (26, 232, 240));
    assert_eq!(&PAGE_MAGIC.to_le_bytes(), b"SBT2");
    assert!(Format::new(7, 8).is_err() && Format::new(257, 8).is_err());
    assert!(Format::new(8, 7).is_err() && Format::new(8, 4097).is_err());
}

fn key(n: u32, len: usize) -> Vec<u8> {
    let mut k = vec![b'k'; len];
    k[len - 4..].copy_from_slice(&n.to_be_bytes());
    k
}

#[test]
fn entries_round_trip_at_every_size_and_any_changed_word_fails_the_check() {
    for ((k, v), _) in PINS {
        let f = Format::new(k, v).unwrap();
        let low = key(1, k);
        let high = key(1000, k / 2 + 4);
        let mut p = PageBuf::new(f, 0, &low, Some(&high), Some(GlobalAddr::new(1, 8192)));
        let n = f.leaf.count;
        for i in 0..n {
            let kk = key(2 + i as u32, k - i % 3);
            let val = vec![i as u8; v.min(f.inline) - i % 2];
            let field =
                if i % 4 == 3 { Field::block(GlobalAddr::new(0, 64 * i as u64), v) } else { Field::inline(&val) };
            p.set_leaf(i, &kk, &field);
        }
        p.clear_leaf(n / 2);
        p.seal(6);
        let r = PageRef::check(&p.b, f).expect("valid");
        assert_eq!(r.seq(), 7, "a leaf's sequence number has bit 0 set");
        assert_eq!(r.lowest().as_slice(), &low[..]);
        assert_eq!(r.highest().unwrap().as_slice(), &high[..]);
        assert_eq!(r.sibling(), Some(GlobalAddr::new(1, 8192)));
        assert_eq!(r.live().count(), n - 1);
        let mut buf = [0u8; INLINE_MAX];
        for i in (0..n).filter(|&i| i != n / 2) {
            let kk = key(2 + i as u32, k - i % 3);
            assert_eq!(r.find(&kk), Some(i), "{k}/{v}: entry {i}");
            assert_eq!(r.key(i).as_slice(), &kk[..]);
            let want = if i % 4 == 3 {
                Value::Block(GlobalAddr::new(0, 64 * i as u64), v)
            } else {
                Value::Inline(&[i as u8; INLINE_MAX][..v.min(f.inline) - i % 2])
            };
            assert_eq!(r.value(i, &mut buf), want, "{k}/{v}: entry {i}");
            // The entry's lines alone validate and decode the same.
            let (l, m) = f.leaf_entry_lines(i);
            let lines = PageRef::check_lines(&p.b[l * LINE..(l + m) * LINE], l, f).expect("entry lines");
            assert!(lines.entry_is(i, &kk));
        }
        assert_eq!(r.find(&key(2 + (n / 2) as u32, k - (n / 2) % 3)), None, "a cleared entry is not found");
        // A torn word anywhere fails the page; in an entry's lines, fails them.
        for word in (0..f.page / 8).step_by(3) {
            let mut t = p.clone();
            t.b[word * 8] ^= 0x40;
            assert!(PageRef::check(&t.b, f).is_none(), "{k}/{v}: word {word} changed yet the page validated");
        }
        // Two consistent versions mixed line by line.
        let mut q = p.clone();
        q.clear_leaf(0);
        q.seal_next();
        let (l, m) = f.leaf_entry_lines(0);
        let mut mixed = p.clone();
        mixed.b[l * LINE..(l + 1) * LINE].copy_from_slice(&q.b[l * LINE..(l + 1) * LINE]);
        assert!(PageRef::check(&mixed.b, f).is_none(), "lines of two versions were accepted");
        if m > 1 {
            let lines = &mixed.b[l * LINE..(l + m) * LINE];
            assert!(PageRef::check_lines(lines, l, f).is_none(), "{k}/{v}: an entry torn across lines was accepted");
        }
    }
    assert!(PageRef::check(&[0u8; 1024], Format::paper()).is_none(), "a zero page is not a page");
}

#[test]
fn internal_pages_route_keys_by_their_sorted_entries() {
    for ((k, v), _) in PINS {
        let f = Format::new(k, v).unwrap();
        let mut p = PageBuf::new(f, 1, &[], None, None);
        p.set_leftmost(GlobalAddr::new(0, 1024));
        let (a, b) = (key(10, k), key(20, k));
        p.set_sorted(&[(Key::new(&a), GlobalAddr::new(0, 2048)), (Key::new(&b), GlobalAddr::new(0, 3072))]);
        p.seal(2);
        let v = PageRef::check(&p.b, f).unwrap();
        assert!(!seq_is_leaf(v.seq()));
        assert_eq!(v.child_for(&[]).offset(), 1024);
        assert_eq!(v.child_for(&key(9, k)).offset(), 1024);
        assert_eq!(v.child_for(&a).offset(), 2048);
        assert_eq!(v.child_for(&key(19, k)).offset(), 2048);
        assert_eq!(v.child_for(&[0xff; 300][..k]).offset(), 3072);
        assert_eq!(v.live().count(), 2);
        // A prefix sorts before the longer key.
        assert_eq!(v.child_for(&a[..k - 1]).offset(), 1024);
    }
}

#[test]
fn meta_and_root_word_round_trip() {
    let m = Meta {
        root: root_word(3, GlobalAddr::new(2, 8192)),
        locks: vec![GlobalAddr::new(0, 4096); 3],
        sizes: (24, 1000),
        name: GlobalAddr::new(0, 640),
    };
    assert_eq!(Meta::decode(&m.encode()), Some(m.clone()));
    assert_eq!(m.format().unwrap().page, 2048);
    assert_eq!(unpack_root(m.root), (3, GlobalAddr::new(2, 8192)));
    assert!(Meta::decode(&[0u8; META]).is_none());
    assert!(lock_slot(GlobalAddr::new(0, 1 << 30)) < LOCK_SLOTS);
    // Consecutive pages spread over the lock table.
    let slots: std::collections::HashSet<u64> =
        (0..LOCK_SLOTS).map(|i| lock_slot(GlobalAddr::new(0, 4096 + i * 1024))).collect();
    assert!(slots.len() as u64 > LOCK_SLOTS / 2, "{} distinct slots", slots.len());
}

#[test]
fn the_key_before_another_is_the_greatest_one_less_than_it() {
    // Every key of at most two bytes, in order: each one's predecessor.
    let mut all: Vec<Vec<u8>> = vec![vec![]];
    all.extend((0..=255u8).map(|a| vec![a]));
    all.extend((0..=255u8).flat_map(|a| (0..=255u8).map(move |b| vec![a, b])));
    all.sort();
    assert_eq!(Key::EMPTY.before(2), None);
    for w in all.windows(2) {
        let got = Key::new(&w[1]).before(2).expect("a key before");
        assert_eq!(got.as_slice(), &w[0][..], "before {:?}", w[1]);
    }
    // Longer trees: the tail fills with 0xff up to the longest key.
    assert_eq!(Key::new(&[7, 3]).before(5).unwrap().as_slice(), &[7, 2, 0xff, 0xff, 0xff]);
    assert_eq!(Key::new(&[7, 0]).before(5).unwrap().as_slice(), &[7]);
}
