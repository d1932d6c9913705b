//! A linear-probing hash table on blade 0 implementing [`KvIndex`] (see the tutorial's
//! "Your own index"). Root `lp:NAME` → header [magic, n, slots' offset]; a slot is 0
//! (empty), 1 (deleted) or fingerprint << 48 | block; a block is [key len u32, value len
//! u32, key, value], never changed. Not built: freeing old blocks, reusing slots, growing.

use smart_core::hash::bytes as hash;
use smart_core::index::Audit;
use smart_core::{Ctx, Error, GlobalAddr, KvIndex};

const MAGIC: u64 = u64::from_le_bytes(*b"LPHASH01");
const TOMB: u64 = 1;
const WINDOW: u64 = 8; // slots per READ: one 64-byte line
fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap())
}

/// One thread's handle on a table.
#[derive(Clone)]
pub(crate) struct LinearProbe {
    ctx: Ctx,
    slots: u64,
    n: u64,
}
impl LinearProbe {
    fn slot(&self, i: u64) -> GlobalAddr {
        GlobalAddr::new(0, self.slots + 8 * (i % self.n))
    }
    /// Walks the key's probe sequence a window at a time: (slot, its word,
    /// the value) where the key is, or (the first empty slot, 0, None).
    async fn probe(&self, key: &[u8], h: u64) -> Result<(u64, u64, Option<Vec<u8>>), Error> {
        let mut i = h % self.n;
        for _ in 0..self.n.div_ceil(WINDOW) + 1 {
            let len = WINDOW.min(self.n - i % self.n); // a window stops at the array's end
            let mut words = vec![0u8; 8 * len as usize];
            self.ctx.read(self.slot(i), &mut words).await?;
            for j in 0..len as usize {
                let w = word(&words, j);
                if w == 0 {
                    return Ok((i, 0, None));
                }
                if w != TOMB && w >> 48 == h >> 48 {
                    let (k, v) = self.read_block(w).await?;
                    if k == key {
                        return Ok((i, w, Some(v)));
                    }
                }
                i += 1;
            }
        }
        Err(Error::Unsupported(format!("linear-probing table full ({} slots)", self.n)))
    }
    async fn read_block(&self, slot: u64) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let at = GlobalAddr::new(0, slot & ((1 << 48) - 1));
        let mut head = [0u8; 8];
        self.ctx.read(at, &mut head).await?;
        let (kl, vl) = (word(&head, 0) as u32 as usize, (word(&head, 0) >> 32) as usize);
        let mut kv = vec![0u8; kl + vl];
        self.ctx.read(at.add(8), &mut kv).await?;
        let v = kv.split_off(kl);
        Ok((kv, v))
    }
    /// Every write: CAS the key's slot from what was read to a new block (a
    /// tombstone when `value` is `None`); retry a lost CAS, after ConflictAvoid's
    /// backoff. `insert`: may go where the key is absent; `update`: where present.
    async fn put(&mut self, key: &[u8], value: Option<&[u8]>, insert: bool, update: bool) -> Result<bool, Error> {
        let (h, ctx) = (hash(key), self.ctx.clone());
        let mut op = ctx.op_on(h).await; // one op on a key at a time per thread
        let mut new = value.is_none().then_some(TOMB);
        loop {
            let (slot, old, found) = self.probe(key, h).await?;
            if (found.is_some() && !update) || (found.is_none() && !insert) {
                return Ok(false);
            }
            if new.is_none() {
                // The block is written (and complete) before any CAS names it.
                let v = value.unwrap_or_default();
                let b = [&(key.len() as u32).to_le_bytes()[..], &(v.len() as u32).to_le_bytes(), key, v].concat();
                let at = ctx.alloc(0, b.len() as u64, 8).await?;
                ctx.write_all(at, &b).await?;
                new = Some((h >> 48) << 48 | at.offset());
            }
            if op.commit(ctx.cas(self.slot(slot), old, new.unwrap())).await? == old {
                return Ok(true);
            }
            op.retry().await;
        }
    }
}

impl KvIndex for LinearProbe {
    const APP: &'static str = "lp";
    type Error = Error;
    type Stats = (); // no counters of its own
    type Shape = u64; // slots

    async fn open_or_create(ctx: &Ctx, name: &str, capacity: u64) -> Result<(Self, bool), Error> {
        let root = format!("lp:{name}");
        let (existed, header) = match ctx.root(0, &root).await? {
            Some(h) => (true, h),
            None => {
                let n = (capacity * 2).next_power_of_two().max(16);
                let slots = ctx.alloc(0, 8 * n, 64).await?;
                ctx.write_all(slots, &vec![0u8; 8 * n as usize]).await?;
                let h = ctx.alloc(0, 64, 64).await?;
                ctx.write(h, &[MAGIC, n, slots.offset()].map(u64::to_le_bytes).concat()).await?;
                let won = ctx.set_root(0, &root, h).await?; // by CAS: the first creator wins
                (won != h, won)
            }
        };
        let mut w = [0u8; 24];
        ctx.read(header, &mut w).await?;
        if word(&w, 0) != MAGIC {
            return Err(Error::Unsupported(format!("{root} is not a linear-probing table")));
        }
        Ok((LinearProbe { ctx: ctx.clone(), slots: word(&w, 2), n: word(&w, 1) }, existed))
    }

    async fn exists(ctx: &Ctx, name: &str) -> Result<bool, Error> {
        Ok(ctx.root(0, &format!("lp:{name}")).await?.is_some())
    }
    async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        Ok(self.probe(key, hash(key)).await?.2.map(|v| *out = v).is_some())
    }
    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Error> {
        self.put(key, Some(value), true, false).await
    }
    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Error> {
        self.put(key, Some(value), false, true).await
    }
    async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.put(key, Some(value), true, true).await.map(|_| ())
    }
    async fn delete(&mut self, key: &[u8]) -> Result<bool, Error> {
        self.put(key, None, false, true).await
    }
    fn stats(&self) {}
    async fn shape(&mut self) -> Result<u64, Error> {
        Ok(self.n)
    }
    async fn audit(&mut self) -> Result<Audit, Error> {
        let mut words = vec![0u8; 8 * self.n as usize];
        self.ctx.read_all(self.slot(0), &mut words).await?;
        let mut audit = Audit::default();
        for w in (0..self.n as usize).map(|i| word(&words, i)).filter(|w| *w > TOMB) {
            audit.keys.push(self.read_block(w).await?.0);
        }
        Ok(audit)
    }
}
