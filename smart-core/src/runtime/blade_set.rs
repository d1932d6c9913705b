//! The run's memory blades checked against the set they formed when first
//! used together (the superblock's identity and set words, see
//! [`crate::layout`]).

use super::Ctx;
use crate::{layout, Error, GlobalAddr, Result};

/// What one blade's superblock says of it and its set.
#[derive(Clone, Copy)]
struct Seen {
    identity: u64,
    place: u64,
    next: u64,
}

impl Ctx {
    /// Checks every blade's superblock ([`Ctx::check_blade`], in the same
    /// READ), then that the run's blades, in this order, are the set they
    /// were when first used together, and records on each blade what it did
    /// not record yet: its
    /// place (blade 0's identity and its index) and the identity of the next
    /// blade. Run once per process before anything is read: addresses name
    /// blades by index, so data made over a list of blades means something
    /// only over the same blades in the same order.
    ///
    /// A prefix of a set, and a set extended by new blades, pass: each
    /// blade's place is unchanged. What fails, as [`Error::BladeSet`]:
    /// - a blade restarted without its backing file, or replaced: its
    ///   predecessor recorded another identity as its next blade (blade 0's
    ///   replacement is found by blade 1, whose place names the old blade 0);
    /// - blades listed in another order than when first used;
    /// - a blade that was part of another set;
    /// - two blades with one identity: one blade listed twice (under two
    ///   addresses), or one serving a copy of the other's backing file.
    ///
    /// # Errors
    /// [`Error::BladeSet`], [`Error::Layout`]; verb errors.
    pub async fn check_blade_set(&self) -> Result<()> {
        let (seen, _) = self.set_words().await?;
        if let Some((blade, s)) = seen.iter().enumerate().find(|(_, s)| s.identity >> 16 == 0) {
            return Err(Error::Damaged {
                blade: blade as u16,
                what: format!(
                    "its identity word is {:#x}: a memory blade draws one when it starts (an older memory-blade \
                     build, or a damaged superblock)",
                    s.identity
                ),
            });
        }
        // Every check before any write, so that a refused list changes
        // nothing.
        for (b, s) in seen.iter().enumerate() {
            if let Some(a) = seen[..b].iter().position(|o| o.identity == s.identity) {
                return Err(Error::BladeSet {
                    blade: b as u16,
                    what: format!(
                        "has the identity of memory blade {a} ({:#018x}): it is the same blade under another \
                         address, or one serves a copy of the other's backing file",
                        s.identity
                    ),
                });
            }
        }
        for (b, s) in seen.iter().enumerate() {
            judge(&seen, b, *s)?;
        }
        let head = seen[0].identity;
        for (b, s) in seen.iter().enumerate() {
            let blade = b as u16;
            let mut now = *s;
            if s.place == 0 {
                now.place =
                    self.cas(GlobalAddr::new(blade, layout::OFF_SET_PLACE), 0, layout::set_place(head, blade)).await?;
                if now.place == 0 {
                    now.place = layout::set_place(head, blade);
                }
            }
            if let Some(next) = seen.get(b + 1).filter(|_| s.next == 0) {
                now.next = self.cas(GlobalAddr::new(blade, layout::OFF_SET_NEXT), 0, next.identity).await?;
                if now.next == 0 {
                    now.next = next.identity;
                }
            }
            // Another compute blade may have recorded another set meanwhile.
            judge(&seen, b, now)?;
        }
        Ok(())
    }
}

impl Ctx {
    /// The superblock words of every blade (identity, place, next), and
    /// every blade's heap pointer.
    async fn set_words(&self) -> Result<(Vec<Seen>, Vec<u64>)> {
        let n = self.blades().len();
        let mut seen = Vec::with_capacity(n);
        let mut heaps = Vec::with_capacity(n);
        for b in 0..n {
            let w = self.superblock(b as u16).await?;
            let word = |off: u64| w[off as usize / 8];
            seen.push(Seen {
                identity: word(layout::OFF_IDENTITY),
                place: word(layout::OFF_SET_PLACE),
                next: word(layout::OFF_SET_NEXT),
            });
            heaps.push(word(layout::OFF_HEAP));
        }
        Ok((seen, heaps))
    }

    /// Each blade's identity, as its superblock holds it: drawn when the
    /// blade started on a new region, so a blade restarted without its
    /// data (or replaced) has another (for a coordinator's configuration);
    /// 0 for the blades of `absent`, which are not asked.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn blade_identities(&self, absent: &[u16]) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(self.blades().len());
        for b in 0..self.blades().len() as u16 {
            let id = if absent.contains(&b) { 0 } else { self.superblock(b).await?[layout::OFF_IDENTITY as usize / 8] };
            out.push(id);
        }
        Ok(out)
    }

    /// [`Ctx::adopt_blades`] of one blade, `i`.
    ///
    /// # Errors
    /// As [`Ctx::adopt_blades`].
    pub async fn adopt_blade(&self, i: u16) -> Result<()> {
        self.adopt_blades(&[i]).await
    }

    /// Adopts fresh memory blades as blades `lost` of the set, in the places
    /// of blades that were lost (restarted without their backing files, or
    /// replaced), for a rebuild of what they held from other blades' copies:
    /// checks that each is fresh (no place in a set, nothing allocated) and
    /// that the other blades form the set with the lost blades at `lost`,
    /// then records them in the set ([`Ctx::check_blade_set`] passes from
    /// then on). Every lost blade of the set must be in `lost`: a blade of
    /// the list with no place is refused otherwise.
    ///
    /// Every blade's place names the set by blade 0's identity (its top 48
    /// bits), so a blade adopted as blade 0 takes those bits of the lost
    /// blade 0's identity, which every other blade's place keeps (its own
    /// low 16 bits stay): the other blades' places then name it, and nothing
    /// else of theirs changes. It needs a blade that was in the set and was
    /// not lost.
    ///
    /// A lost blade is known by the identity its predecessor recorded as its
    /// next blade; one whose predecessor was lost too is known by nothing
    /// but its place in the list. Run again after it failed part-way, it
    /// resumes: a blade of `lost` already adopted (its place recorded,
    /// nothing allocated) is kept.
    ///
    /// # Errors
    /// [`Error::BladeSet`] if a blade of `lost` is not fresh, the others are
    /// not the set, or (for blade 0) there is no blade 1 that knows the set;
    /// verb errors.
    pub async fn adopt_blades(&self, lost: &[u16]) -> Result<()> {
        let n = self.blades().len();
        let refuse = |blade, what: String| Err(Error::BladeSet { blade, what });
        let mut lost = lost.to_vec();
        lost.sort_unstable();
        lost.dedup();
        let listed = lost.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        if let Some(&i) = lost.iter().find(|&&i| usize::from(i) >= n) {
            return refuse(i, format!("there are {n} blades in this list"));
        }
        let is_lost = |b: usize| lost.contains(&(b as u16));
        if is_lost(0) && n < 2 {
            return refuse(
                0,
                "a set of one blade keeps no trace of it elsewhere: there is no set to adopt it into".into(),
            );
        }
        let (seen, heaps) = self.set_words().await?;
        // The set's name (blade 0's identity's top 48 bits), as the blades
        // that were not lost keep it in their places.
        let head = if is_lost(0) {
            let Some(k) = (1..n).find(|&k| !is_lost(k)) else {
                return refuse(0, "every blade of this list is to be adopted: no blade knows the set".into());
            };
            if seen[k].place & 0xffff != k as u64 || seen[k].place >> 16 == 0 {
                return refuse(
                    0,
                    format!("blade {k} of this list has no place as blade {k} of a set: no blade 0 was lost here"),
                );
            }
            seen[k].place & !0xffff
        } else {
            seen[0].identity & !0xffff
        };
        let adopted = |b: usize| {
            seen[b].place != 0 && seen[b].place == layout::set_place(head, b as u16) && heaps[b] == layout::HEAP_START
        };
        for &i in &lost {
            let (b, new) = (usize::from(i), seen[usize::from(i)]);
            let fresh = new.place == 0 && new.next == 0 && heaps[b] == layout::HEAP_START;
            if !fresh && !adopted(b) {
                return refuse(
                    i,
                    "is not a fresh memory blade: it has a place in a set, or memory in use (start a new memory-blade \
                     process, without a backing file or on a new one, in the lost blade's place)"
                        .into(),
                );
            }
        }
        // Every other blade must have its place: one without is lost too
        // (or new), and adopting these would record it as a next blade,
        // taking it into the set with nothing of what the lost one held.
        if let Some(j) = (0..n).find(|&j| !is_lost(j) && seen[j].place == 0) {
            return refuse(
                j as u16,
                format!(
                    "has no place in the set either: it was lost too, or is new; a rebuild of blades {listed} needs \
                     every other blade of the set as it was (list every lost blade in one rebuild)"
                ),
            );
        }
        // The lost blades' identities as the others remember them (only
        // the identity of a lost blade is judged below). One whose
        // predecessor was lost too keeps its own: that record went with it.
        let mut was = seen.clone();
        for &i in lost.iter().filter(|&&i| !adopted(usize::from(i))) {
            let b = usize::from(i);
            if b == 0 {
                was[0].identity = head | (seen[0].identity & 0xffff);
            } else if !is_lost(b - 1) {
                was[b].identity = seen[b - 1].next;
                if was[b].identity == 0 {
                    return refuse(
                        i,
                        format!("blade {} of this list never had a next blade: no blade was lost here", b - 1),
                    );
                }
            }
        }
        // The others, judged as if the lost blades were still in their
        // places.
        for (b, s) in was.iter().enumerate() {
            if !is_lost(b) {
                judge(&was, b, *s)?;
            }
        }
        for &i in &lost {
            let b = usize::from(i);
            if let Some(o) = (0..n).find(|&o| o != b && seen[o].identity == seen[b].identity) {
                return refuse(i, format!("has the identity of memory blade {o} of this list"));
            }
        }
        for &i in lost.iter().filter(|&&i| !adopted(usize::from(i))) {
            let b = usize::from(i);
            let (old, new) = (was[b], seen[b]);
            if b == 0 {
                // Taking the set's bits is the adoption: once the identity
                // word holds them, the others' places name this blade.
                let at = GlobalAddr::new(0, layout::OFF_IDENTITY);
                if self.cas(at, new.identity, old.identity).await? != new.identity {
                    return refuse(0, "another compute blade changed this blade meanwhile".into());
                }
            } else if !is_lost(b - 1) {
                let prev = GlobalAddr::new(i - 1, layout::OFF_SET_NEXT);
                if self.cas(prev, old.identity, new.identity).await? != old.identity {
                    return refuse(i, "another compute blade changed the set meanwhile".into());
                }
            }
            // (A lost predecessor, adopted just before, recorded this one as
            // its next blade.)
            self.cas(GlobalAddr::new(i, layout::OFF_SET_PLACE), 0, layout::set_place(head, i)).await?;
            if let Some(next) = seen.get(b + 1) {
                self.cas(GlobalAddr::new(i, layout::OFF_SET_NEXT), 0, next.identity).await?;
            }
        }
        self.check_blade_set().await
    }
}

/// Whether blade `b`, which says `s` of itself, fits its place in `seen`.
fn judge(seen: &[Seen], b: usize, s: Seen) -> Result<()> {
    let blade = b as u16;
    let mask = !0xffff_u64;
    if s.place != 0 && s.place != layout::set_place(seen[0].identity, blade) {
        let was = s.place & 0xffff;
        let what = match seen.iter().position(|o| o.identity & mask == s.place & mask) {
            Some(head) => format!(
                "was blade {was} of a set whose blade 0 is now memory blade {head}: the blades are listed in another \
                 order than when they were first used together (addresses name blades by their place in the list), \
                 so list them in that order"
            ),
            None => format!(
                "was blade {was} of another set, whose blade 0 (identity {:#014x}…) is not in this list: that blade \
                 was restarted without its backing file or replaced, or this list mixes blades of different sets",
                s.place >> 16
            ),
        };
        return Err(Error::BladeSet { blade, what });
    }
    if let Some(next) = seen.get(b + 1) {
        if s.next != 0 && s.next != next.identity {
            return Err(Error::BladeSet {
                blade: blade + 1,
                what: format!(
                    "is not the blade that was blade {} of this set when first used (memory blade {b} recorded \
                     identity {:#018x}, it has {:#018x}): it was restarted without its backing file or replaced, and \
                     what was kept on it is lost",
                    b + 1,
                    s.next,
                    next.identity
                ),
            });
        }
    }
    Ok(())
}
