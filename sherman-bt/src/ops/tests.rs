use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig};

use crate::layout::{root_word, Key};
use crate::ShermanBt;

#[test]
fn a_grow_that_loses_its_cas_adopts_the_winners_root_and_changes_nothing() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let (mut a, _) = ShermanBt::open_or_create(&ctx, "g").await.unwrap();
        let (_, leaf) = a.refresh_root().await.unwrap();
        for k in 0..100 {
            a.insert_u64(k, k).await.unwrap();
        }
        let (level, root) = a.refresh_root().await.unwrap();
        assert_eq!(level, 1, "100 keys need two levels");
        // A client that still sees the first leaf as the root splits it
        // and tries to put a new root above it: the CAS fails.
        assert!(!a.grow(0, leaf, Some((Key::new(&50u64.to_be_bytes()), leaf))).await.unwrap());
        assert_eq!(a.local.borrow().root, Some(root_word(1, root)), "the winner's root is adopted");
        assert_eq!(a.counters().root_races, 1);
        let (shape, keys) = a.walk().await.unwrap();
        assert_eq!((shape.depth, keys.len()), (2, 100));
        for k in 0..100 {
            assert_eq!(a.get_u64(k).await.unwrap(), Some(k));
        }
    });
}

/// Page links are remote memory any client can write: a leaf whose
/// sibling link leads back to itself, or into the superblock, ends a
/// scan with an error naming it, never a cycle or a read of the
/// superblock as a page.
#[test]
fn a_sibling_link_that_leads_back_or_out_of_the_heap_is_an_error() {
    use crate::layout::{PageBuf, PageRef};
    use crate::ShermanError;
    use smart_core::GlobalAddr;

    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let (mut a, _) = ShermanBt::open_or_create(&ctx, "links").await.unwrap();
        for k in 0..200 {
            a.insert_u64(k, k).await.unwrap();
        }
        let first = a.descend(&0u64.to_be_bytes(), 0, None).await.unwrap();
        let mut out = Vec::new();
        a.scan_u64(0, 200, &mut out).await.unwrap();
        assert_eq!(out.len(), 200);
        let f = a.f;
        for (link, says) in [(first, "does not start there"), (GlobalAddr::new(0, 16), "below the heap")] {
            let mut bytes = vec![0u8; f.page];
            ctx.read(first, &mut bytes).await.unwrap();
            let mut page = PageBuf::from_page(PageRef::check(&bytes, f).unwrap());
            assert!(page.view().highest().is_some(), "the first leaf has a right sibling");
            page.set_sibling(Some(link));
            page.seal_next();
            ctx.write(first, &page.b[..]).await.unwrap();
            let err = a.scan_u64(0, 200, &mut out).await.unwrap_err();
            assert!(matches!(err, ShermanError::Corrupt(_)) && err.to_string().contains(says), "{err}");
        }
    });
}
