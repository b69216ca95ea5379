//! The baseline's CPU load: threads that burn as much CPU per second as a
//! pull does, for the baseline window. Without it the baseline runs beside
//! idle vCPUs, which on a VM wake late for the neighbour's I/O completions
//! and make the neighbour *slower* alone than beside a pull; a pull then
//! looks harmless. A pull's load is two processes: the client,
//! at its nice, and the server answering it on the same machine, at
//! [`SERVER_NICE`]. Both are matched, each at its own nice: matched to the
//! client alone, the baseline left the server's share of the CPU idle,
//! which the pulling arms (and their in-RAM twins) did not.

use super::repo::SERVER_NICE;
use anyhow::{Context, Result};
use std::time::{Duration, Instant};

/// How the baseline loads the CPU.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Load {
    /// The client's CPU seconds per second (0: none).
    pub cpu_per_s: f64,
    /// The client's nice.
    pub nice: i32,
    /// The server's CPU seconds per second, burned at [`SERVER_NICE`].
    pub server_cpu_per_s: f64,
}

impl Load {
    pub const IDLE: Load = Load {
        cpu_per_s: 0.0,
        nice: 0,
        server_cpu_per_s: 0.0,
    };
}

/// Each burner thread checks its own CPU time this often.
const TICK: Duration = Duration::from_millis(2);

/// A spinning burner thread offers its CPU back (`sched_yield`) this
/// often. Without it, on a kernel that does not preempt on wake-up (this
/// machine's: a woken task waits for the tick, 4 ms at HZ=250, even
/// beside a `SCHED_IDLE` spinner), the burner delays every wake-up in the
/// neighbour's `fdatasync` chain that lands on its core: two spinning
/// threads at nice 10 took a 2300-byte `O_DSYNC` writer's p99 from 0.97 to
/// 8.8 ms, yielding every 100 µs to 1.0-1.3 ms (`cargo xtask bench io` at
/// 6c256bd). The baseline would then carry a harm of its own, and
/// every ratio to it would credit the pulls with it. Yielding keeps the
/// vCPU busy, which is what the burner is for.
const YIELD_EVERY: Duration = Duration::from_micros(100);

/// The load matching pulls whose client used `cpu_s` and whose server used
/// `server_cpu_s` CPU seconds over `wall_s` seconds each (median rates),
/// the client's at `nice`; idle when nothing was measured.
pub fn matched(cpu_s: &[f64], server_cpu_s: &[f64], wall_s: &[f64], nice: i32) -> Load {
    Load {
        cpu_per_s: median_rate(cpu_s, wall_s),
        nice,
        server_cpu_per_s: median_rate(server_cpu_s, wall_s),
    }
}

fn median_rate(cpu_s: &[f64], wall_s: &[f64]) -> f64 {
    let rates: Vec<f64> = cpu_s
        .iter()
        .zip(wall_s)
        .filter(|(_, w)| **w > 0.0)
        .map(|(c, w)| c / w)
        .collect();
    let rate = super::bootstrap::median(&rates);
    if rate.is_finite() {
        rate.max(0.0)
    } else {
        0.0
    }
}

/// Burns `load` for `window`, the client's share and the server's each
/// packed onto their own threads; returns the CPU seconds burned.
pub fn burn(load: Load, window: Duration) -> Result<f64> {
    let threads: Vec<(f64, i32)> = duties(load.cpu_per_s)
        .into_iter()
        .map(|d| (d, load.nice))
        .chain(
            duties(load.server_cpu_per_s)
                .into_iter()
                .map(|d| (d, SERVER_NICE)),
        )
        .collect();
    // The window lasts as long whether or not anything burns in it.
    if threads.is_empty() {
        crate::bench::sleep(window)?;
        return Ok(0.0);
    }
    let start = Instant::now();
    let handles: Vec<_> = threads
        .into_iter()
        .map(|(duty, nice)| std::thread::spawn(move || burn_thread(duty, nice, start, window)))
        .collect();
    let mut total = 0.0;
    for h in handles {
        total += h
            .join()
            .map_err(|_| anyhow::anyhow!("a burner thread panicked"))??;
    }
    crate::bench::check_interrupted()?;
    Ok(total)
}

/// The burner threads' duty cycles for `cpu_per_s`: as few threads as
/// carry it, all spinning but one, which takes the remainder. The shape
/// matters on a VM: a thread that sleeps between ticks leaves its vCPU to
/// idle and wake, which slows the neighbour's I/O completions. Spread
/// evenly (1.02 CPU/s as two threads at 51%), the baseline's p99 jumped
/// from 0.5 to 4.7 ms as the matched rate crossed 1.0, and a run could
/// not be judged; packed, it changes with the rate, not with its ceiling.
fn duties(cpu_per_s: f64) -> Vec<f64> {
    /// A remainder below this is a rounding of the measured rate.
    const NEGLIGIBLE: f64 = 0.01;
    let whole = cpu_per_s.floor();
    let rest = cpu_per_s - whole;
    let mut duties = vec![1.0; whole as usize];
    if rest >= NEGLIGIBLE {
        duties.push(rest);
    }
    duties
}

/// One thread: spin while its CPU time is behind `duty` of the wall time
/// so far, sleep while ahead (so preemption is made up for, not lost).
fn burn_thread(duty: f64, nice: i32, start: Instant, window: Duration) -> Result<f64> {
    // Linux keeps nice per thread: this sets only the burner's.
    rustix::process::setpriority_process(None, nice).context("setting the burner's nice")?;
    let cpu0 = thread_cpu()?;
    let mut x = 0u64;
    loop {
        let el = start.elapsed();
        if el >= window || crate::bench::interrupted() {
            break;
        }
        if thread_cpu()? - cpu0 < duty * el.as_secs_f64() {
            let until = Instant::now() + TICK;
            let mut yielded = Instant::now();
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                if now.duration_since(yielded) >= YIELD_EVERY {
                    std::thread::yield_now();
                    yielded = Instant::now();
                }
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        } else {
            std::thread::sleep(TICK);
        }
    }
    Ok(thread_cpu()? - cpu0)
}

/// This thread's CPU seconds (user + system), from procfs.
fn thread_cpu() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")
        .context("reading /proc/thread-self/stat")?;
    crate::bench::cpu_seconds_of(&stat)
        .map(|(own, _)| own)
        .context("parsing /proc/thread-self/stat")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matched_load() {
        // (client cpu s, server cpu s, wall s, expected client and server
        // cpu per s)
        type Case<'a> = (&'a [f64], &'a [f64], &'a [f64], f64, f64);
        let cases: &[Case] = &[
            (&[], &[], &[], 0.0, 0.0),
            (&[2.0], &[1.0], &[4.0], 0.5, 0.25),
            (
                &[2.0, 6.0, 3.0],
                &[0.2, 0.4, 0.6],
                &[2.0, 2.0, 2.0],
                1.5,
                0.2,
            ),
            (&[1.0], &[1.0], &[0.0], 0.0, 0.0),
        ];
        for &(c, sc, w, want, want_server) in cases {
            assert_eq!(
                matched(c, sc, w, 10),
                Load {
                    cpu_per_s: want,
                    nice: 10,
                    server_cpu_per_s: want_server,
                },
                "{c:?} {sc:?} {w:?}"
            );
        }
    }

    #[test]
    fn duties_pack_the_load_onto_spinning_threads() {
        // (cpu per s, duty of each thread)
        let cases: &[(f64, &[f64])] = &[
            (0.0, &[]),
            (0.005, &[]),
            (0.5, &[0.5]),
            (1.0, &[1.0]),
            (1.02, &[1.0, 0.02]),
            (1.5, &[1.0, 0.5]),
            (2.0, &[1.0, 1.0]),
        ];
        for &(rate, want) in cases {
            let got = duties(rate);
            assert_eq!(got.len(), want.len(), "{rate}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-9, "{rate}: {got:?}");
            }
        }
    }

    #[test]
    fn burns_about_what_it_is_asked() {
        let window = Duration::from_millis(600);
        let burned = burn(
            Load {
                cpu_per_s: 0.5,
                // At nice 19 a busy machine (a parallel test run on 2
                // cores) starves the threads for the whole window; the
                // lower bound below needs them scheduled at all.
                nice: 0,
                server_cpu_per_s: 0.25,
            },
            window,
        )
        .unwrap();
        // Procfs counts in 10 ms ticks; a loaded machine may starve the
        // threads, so only an upper bound is firm: both shares, no more.
        assert!(burned <= 0.75 * 0.6 + 0.05, "burned {burned}");
        assert!(burned > 0.0, "burned nothing");
        assert_eq!(burn(Load::IDLE, Duration::ZERO).unwrap(), 0.0);
        // A rate too small for a thread still lasts the window.
        let t = Instant::now();
        let idle = Load {
            cpu_per_s: 0.005,
            nice: 0,
            server_cpu_per_s: 0.005,
        };
        assert_eq!(burn(idle, Duration::from_millis(100)).unwrap(), 0.0);
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
    }
}
