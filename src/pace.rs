//! The pace of `compute-blade rebuild --online`'s copy: at most
//! `--copy-rate` bytes a second, and with `--foreground-share` as fast as
//! the compute blades keep that share of their throughput before the copy
//! ([`ford_dtx::rejoin::Throttle`]), read from what they publish in the
//! registry ([`ford_dtx::rejoin::foreground`]) by a thread of its own.
//!
//! "Before" is measured with the blade already joining (every transaction
//! writes it), for two seconds before the first bucket is copied: the share
//! is of what the copy itself can take from the foreground. Joining's own
//! cost (one more copy written per record) and the fresh blade's are not
//! the copy's to throttle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ford_dtx::db::Db;
use ford_dtx::rejoin::{foreground, Throttle, Throughput};
use smart_core::runtime::RuntimeConfig;
use smart_core::{Runtime, Transport};

/// How often the registry is read.
const READ_EVERY: Duration = Duration::from_millis(250);
/// How long the throughput before the copy is measured.
const BEFORE: Duration = Duration::from_secs(2);
/// How long "before" waits for registered compute blades that commit
/// nothing yet (stalled behind a dead copier's locks, or following a new
/// epoch) to commit again.
const BEFORE_MAX: Duration = Duration::from_secs(10);

/// What the pace did, for the record.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Summary {
    /// The share the foreground was to keep.
    pub share: f64,
    /// Its transactions a second before the copy.
    pub before_txn_per_s: f64,
    /// Its transactions a second during the copy (in the seconds it ran).
    pub during_txn_per_s: f64,
    /// Seconds of the copy with the foreground below its share.
    pub seconds_below: u64,
    /// Seconds of the copy with a foreground (compute blades committing:
    /// without any, the copy goes at the cap).
    pub seconds: u64,
    /// The lowest and the mean rate of the copy, bytes a second.
    pub rate_min: f64,
    /// The mean rate (over the seconds adjusted).
    pub rate_mean: f64,
}

impl Summary {
    /// What the pace did, for people (`cap`: `--copy-rate`, bytes a
    /// second).
    pub fn said(&self, cap: f64) -> String {
        if self.seconds == 0 {
            return format!("no compute blade committed during the copy (share {:.2}): it went at the cap", self.share);
        }
        format!(
            "the compute blades kept {:.0} % of their {:.0} txn/s before the copy (share {:.2}; below it {} of {} s); \
             the copy ran at {:.2} MB/s on average (at least {:.2}, cap {:.2})",
            self.during_txn_per_s / self.before_txn_per_s * 100.0,
            self.before_txn_per_s,
            self.share,
            self.seconds_below,
            self.seconds,
            self.rate_mean / 1e6,
            self.rate_min / 1e6,
            cap / 1e6
        )
    }
}

/// The copy's pace.
#[derive(Debug)]
pub struct Pace {
    /// The rate now (f64 bits), set by the thread.
    rate: Arc<AtomicU64>,
    /// The foreground's share of its throughput before (f64 bits; NaN
    /// until known), for progress lines.
    kept: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Summary>>>,
}

impl Pace {
    /// At `cap` bytes a second.
    pub fn fixed(cap: f64) -> Pace {
        Pace {
            rate: Arc::new(AtomicU64::new(cap.to_bits())),
            kept: Arc::new(AtomicU64::new(f64::NAN.to_bits())),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Measures the foreground's throughput on `db` (its registry) for two
    /// seconds (up to ten while compute blades that committed before commit
    /// nothing), then keeps adjusting the rate (at most `cap`) so that it
    /// stays at `share` of that, until [`Pace::finish`]. With no
    /// transaction committed meanwhile, the rate is `cap` (said if
    /// `progress`).
    ///
    /// # Errors
    /// Verb errors.
    pub fn holding(transport: Arc<dyn Transport>, db: Db, cap: f64, share: f64, progress: bool) -> Result<Pace> {
        let rcfg = RuntimeConfig { slots: 4, coroutines: 1, ..RuntimeConfig::default() };
        let mut rt = Runtime::new(&*transport, 0, rcfg.clone())?;
        let t0 = Instant::now();
        let mut tp = Throughput::default();
        let db = Arc::new(db);
        read(&mut rt, &db, &mut tp, t0).context("reading the compute blades' progress")?;
        let stalled = |tp: &Throughput| tp.live() > 0 && tp.rate(BEFORE.as_secs_f64() - 0.1).unwrap_or(0.0) <= 0.0;
        while t0.elapsed() < BEFORE || (stalled(&tp) && t0.elapsed() < BEFORE_MAX) {
            std::thread::sleep(READ_EVERY);
            read(&mut rt, &db, &mut tp, t0).context("reading the compute blades' progress")?;
        }
        let before = tp.rate(BEFORE.as_secs_f64() - 0.1).unwrap_or(0.0);
        let mut pace = Pace::fixed(cap);
        if before <= 0.0 {
            if progress {
                eprintln!("pace: no transaction committed in the {BEFORE:?} before the copy: it goes at --copy-rate");
            }
            return Ok(pace);
        }
        if progress {
            eprintln!(
                "pace: the compute blades commit {before:.0} txn/s with the blade joining, before the copy; it keeps \
                 them at {:.0} % of that ({:.2} to {:.2} MB/s)",
                share * 100.0,
                cap / 64e6,
                cap / 1e6
            );
        }
        let mut th = Throttle::new(cap, share, before);
        pace.rate.store(th.rate.to_bits(), Ordering::Relaxed);
        let (rate, kept, stop) = (pace.rate.clone(), pace.kept.clone(), pace.stop.clone());
        let thread = std::thread::Builder::new()
            .name("pace".into())
            .spawn(move || -> Result<Summary> {
                let mut rt = Runtime::new(&*transport, 0, rcfg)?;
                let mut next = Instant::now() + Duration::from_secs(1);
                let (mut seconds, mut below, mut rate_min, mut rate_sum) = (0u64, 0u64, th.rate, 0.0);
                let (mut counted, mut during) = (tp.counted(), 0u64);
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(READ_EVERY);
                    read(&mut rt, &db, &mut tp, t0)?;
                    if Instant::now() >= next {
                        next += Duration::from_secs(1);
                        let now = tp.rate(0.9).unwrap_or(0.0);
                        let second = tp.counted() - counted;
                        counted = tp.counted();
                        if tp.live() == 0 {
                            // The compute blades ended: nothing to hold.
                            th.rate = th.cap;
                            rate.store(th.rate.to_bits(), Ordering::Relaxed);
                            kept.store(f64::NAN.to_bits(), Ordering::Relaxed);
                            continue;
                        }
                        kept.store((now / before).to_bits(), Ordering::Relaxed);
                        below += u64::from(now < share * before);
                        let r = th.adjust(now);
                        rate.store(r.to_bits(), Ordering::Relaxed);
                        (seconds, rate_min, rate_sum, during) =
                            (seconds + 1, rate_min.min(r), rate_sum + r, during + second);
                    }
                }
                Ok(Summary {
                    share,
                    before_txn_per_s: before,
                    during_txn_per_s: during as f64 / (seconds as f64).max(1e-9),
                    seconds_below: below,
                    seconds,
                    rate_min,
                    rate_mean: if seconds == 0 { th.rate } else { rate_sum / seconds as f64 },
                })
            })
            .context("starting the pace thread")?;
        pace.thread = Some(thread);
        Ok(pace)
    }

    /// What paces one copy (from now on), for a thread or a future of its
    /// own.
    pub fn pacer(&self) -> Pacer {
        Pacer { rate: self.rate.clone(), kept: self.kept.clone(), t0: Instant::now(), due: 0.0, paced: 0 }
    }

    /// Stops adjusting; what it did, if it held a share.
    ///
    /// # Errors
    /// The thread's verb errors.
    pub fn finish(mut self) -> Result<Option<Summary>> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => Ok(Some(t.join().map_err(|_| anyhow::anyhow!("the pace thread panicked"))??)),
            None => Ok(None),
        }
    }
}

/// One copy's pacing ([`Pace::pacer`]).
#[derive(Debug)]
pub struct Pacer {
    rate: Arc<AtomicU64>,
    kept: Arc<AtomicU64>,
    t0: Instant,
    /// When (seconds since `t0`) the bytes paced so far may be done, each
    /// bucket's at the rate of its time.
    due: f64,
    paced: u64,
}

impl Pacer {
    /// After the copy reached `bytes` copied: sleeps until they may be done
    /// at the pace's rate (at most a second at a time). Time not used is
    /// not made up for by more than half a second's bytes.
    pub fn after(&mut self, bytes: u64) {
        let now = self.t0.elapsed().as_secs_f64();
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        self.due = self.due.max(now - 0.5) + bytes.saturating_sub(self.paced) as f64 / rate;
        self.paced = bytes;
        if self.due > now {
            std::thread::sleep(Duration::from_secs_f64((self.due - now).min(1.0)));
        }
    }

    /// For a progress line: the share the compute blades kept in the last
    /// second and the rate, if a share is held (else empty).
    pub fn said(&self) -> String {
        let kept = f64::from_bits(self.kept.load(Ordering::Relaxed));
        if kept.is_nan() {
            return String::new();
        }
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        format!("; the compute blades at {:.0} % of before, the copy at {:.2} MB/s", kept * 100.0, rate / 1e6)
    }
}

/// Reads the compute blades' progress into `tp` (at seconds since `t0`).
fn read(rt: &mut Runtime, db: &Arc<Db>, tp: &mut Throughput, t0: Instant) -> Result<()> {
    let (ctx, d) = (rt.ctx(), db.clone());
    let slots = rt.block_on(async move { foreground(&ctx, &d).await })?;
    tp.observe(t0.elapsed().as_secs_f64(), &slots);
    Ok(())
}

impl Drop for Pace {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
