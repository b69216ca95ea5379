//! The refresher's state machine, against a scripted publisher, with
//! tokio's clock paused (a test's sleeps advance it at once).

use super::*;
use std::collections::VecDeque;
use std::sync::Mutex;

/// What the fake's next check answers.
#[derive(Debug, Clone, Copy)]
enum Step {
    New,
    Unchanged,
    Refuse,
    Fail,
    /// A new generation, less something that failed.
    Partial,
}

/// When a check ran (seconds since the test began) and whether forced.
type Calls = Arc<Mutex<Vec<(u64, bool)>>>;

#[derive(Debug)]
struct Fake {
    script: VecDeque<Step>,
    calls: Calls,
    start: Instant,
    next_id: u64,
    /// The `--signatures` directory a generation is published with.
    bundle: Option<PathBuf>,
}

impl Publisher for Fake {
    async fn check(&mut self, force: bool) -> Result<Checked> {
        let at = self.start.elapsed().as_secs();
        self.calls.lock().expect("calls").push((at, force));
        let step = self.script.pop_front().unwrap_or(Step::Unchanged);
        match step {
            Step::New | Step::Partial => {
                self.next_id += 1;
                let mut g =
                    Generation::new(self.next_id, Vec::new(), "/nonexistent".into(), Vec::new());
                // As publication records them: what signatures are watched
                // against.
                g.signatures.bundle_identity = self
                    .bundle
                    .as_deref()
                    .and_then(crate::signing::bundle_identity);
                g.signatures.summary_digest = g
                    .served_summary()
                    .ok()
                    .map(|b| oscontent_format::Checksum::digest(&b));
                if matches!(step, Step::Partial) {
                    return Ok(Checked::Partial(
                        Box::new(g),
                        anyhow::anyhow!("one image unreachable"),
                    ));
                }
                Ok(Checked::New(Box::new(g)))
            }
            Step::Unchanged => Ok(Checked::Unchanged),
            Step::Refuse => Ok(Checked::Refused(anyhow::anyhow!("signature refused"))),
            Step::Fail => anyhow::bail!("source unreachable"),
        }
    }

    fn what(&self) -> &str {
        "the fake"
    }
}

struct Harness {
    sink: Arc<Sink>,
    hup: Arc<Notify>,
    calls: Calls,
}

impl Harness {
    fn refresher(script: &[Step], schedule: Schedule) -> (Self, Refresher<Fake>) {
        let calls = Calls::default();
        let fake = Fake {
            script: script.iter().copied().collect(),
            calls: calls.clone(),
            start: Instant::now(),
            next_id: 0,
            bundle: None,
        };
        let (sink, hup) = (Arc::new(Sink::default()), Arc::new(Notify::new()));
        let refresher = Refresher::new(fake, sink.clone(), hup.clone(), schedule);
        (Self { sink, hup, calls }, refresher)
    }

    fn times(&self) -> Vec<u64> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .map(|c| c.0)
            .collect()
    }

    fn forced(&self) -> Vec<bool> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .map(|c| c.1)
            .collect()
    }

    fn count(&self, outcome: Outcome) -> u64 {
        let checks = &self.sink.metrics().source_checks;
        checks.with_label_values(&[outcome.label()]).get()
    }

    fn generation(&self) -> Option<u64> {
        self.sink.current().map(|g| g.id)
    }
}

async fn advance(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

/// To stop between checks rather than at the instant one is due.
async fn advance_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn schedule(interval: Option<u64>, max_backoff: Option<u64>) -> Schedule {
    Schedule {
        interval: interval.map(Duration::from_secs),
        max_backoff: max_backoff.map(Duration::from_secs),
    }
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_doubling_up_to_the_cap_then_stop_after_success() {
    use Step::*;
    let (h, r) = Harness::refresher(
        &[Fail, Fail, Fail, Fail, Fail, New],
        schedule(None, Some(4)),
    );
    let task = tokio::spawn(r.run());
    advance(100).await;
    // Waits of 1, 2, 4, then the 4 s cap; no interval, so nothing after.
    assert_eq!(h.times(), [0, 1, 3, 7, 11, 15]);
    assert_eq!(h.count(Outcome::Failed), 5);
    assert_eq!(h.count(Outcome::Published), 1);
    assert_eq!(h.generation(), Some(1));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn backoff_resets_after_success_and_a_failure_keeps_the_previous_generation() {
    use Step::*;
    let (h, r) = Harness::refresher(&[Fail, Fail, New, Fail, New], schedule(Some(10), Some(60)));
    let task = tokio::spawn(r.run());
    advance_ms(13_500).await;
    // The failure at 13 s changed nothing served.
    assert_eq!(h.times(), [0, 1, 3, 13]);
    assert_eq!(h.generation(), Some(1));
    assert_eq!(h.sink.metrics().ready.get(), 1);
    advance_ms(1_000).await;
    // Retried after 1 s again, not 4 s: the success reset the backoff.
    assert_eq!(h.times(), [0, 1, 3, 13, 14]);
    assert_eq!(h.generation(), Some(2));
    advance_ms(10_000).await;
    assert_eq!(h.times(), [0, 1, 3, 13, 14, 24], "then the interval");
    assert_eq!(h.count(Outcome::Failed), 3);
    assert_eq!(h.count(Outcome::Published), 2);
    assert_eq!(h.count(Outcome::Unchanged), 1);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn sighup_checks_at_once_and_unchanged_publishes_nothing() {
    use Step::*;
    let (h, r) = Harness::refresher(&[New, Unchanged], schedule(None, Some(300)));
    let task = tokio::spawn(r.run());
    advance(50).await;
    assert_eq!(h.times(), [0]);
    let before = h.sink.current().expect("published");
    h.hup.notify_one();
    advance(1).await;
    assert_eq!(h.times(), [0, 50]);
    assert_eq!(h.forced(), [false, false]);
    assert_eq!(h.count(Outcome::Unchanged), 1);
    assert_eq!(h.count(Outcome::Published), 1);
    let after = h.sink.current().expect("still published");
    assert!(
        Arc::ptr_eq(&before, &after),
        "unchanged: the same generation"
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn without_a_retry_schedule_a_failure_waits_for_sighup() {
    use Step::*;
    let (h, mut r) = Harness::refresher(&[New, Fail, New], Schedule::default());
    r.publish_first().await.expect("first");
    assert_eq!(
        h.count(Outcome::Published),
        0,
        "the first check is not counted"
    );
    let task = tokio::spawn(r.run());
    h.hup.notify_one();
    advance(1000).await;
    assert_eq!(h.times(), [0, 0]);
    assert_eq!(h.generation(), Some(1));
    h.hup.notify_one();
    advance(1).await;
    assert_eq!(h.times(), [0, 0, 1000]);
    assert_eq!(h.generation(), Some(2));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_first_failure_is_the_callers() {
    let (h, mut r) = Harness::refresher(&[Step::Fail], Schedule::default());
    assert!(r.publish_first().await.is_err());
    assert_eq!(h.count(Outcome::Failed), 0);
    assert_eq!(h.generation(), None);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_waits_for_new_signatures_then_republishes_forced() {
    use Step::*;
    let bundle = tempfile::tempdir().expect("tempdir");
    std::fs::write(bundle.path().join("manifest"), b"one").expect("write");
    let sigs = SignatureOptions {
        bundle_dir: Some(bundle.path().to_owned()),
        ..SignatureOptions::default()
    };
    let (h, mut r) = Harness::refresher(&[Refuse, New, Refuse, New], schedule(None, Some(300)));
    r.publisher.bundle = sigs.bundle_dir.clone();
    let r = r.watching(&sigs, Duration::from_secs(10));
    let task = tokio::spawn(r.run());
    advance(1).await;
    // Refused with nothing published: each poll tries again, forced.
    assert_eq!(h.times(), [0]);
    advance(10).await;
    assert_eq!(h.times(), [0, 10]);
    assert_eq!(h.forced(), [false, true]);
    assert_eq!(h.generation(), Some(1));

    // Refused while serving: the same bundle does not trigger, and no timer
    // retries; a changed bundle does.
    h.hup.notify_one();
    advance(35).await;
    assert_eq!(h.times(), [0, 10, 11]);
    assert_eq!(
        h.generation(),
        Some(1),
        "still serving the previous generation"
    );
    std::fs::write(bundle.path().join("manifest"), b"two").expect("write");
    advance(10).await;
    assert_eq!(h.times(), [0, 10, 11, 51]);
    assert_eq!(h.forced(), [false, true, false, true]);
    assert_eq!(h.generation(), Some(2));
    assert_eq!(h.count(Outcome::Failed), 2);
    assert_eq!(h.count(Outcome::Published), 2);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_partial_generation_is_published_and_what_failed_is_retried() {
    use Step::*;
    let (h, r) = Harness::refresher(&[New, Partial, New], schedule(None, Some(60)));
    let task = tokio::spawn(r.run());
    advance(1).await;
    h.hup.notify_one();
    advance_ms(500).await;
    // Published at once, although one image failed...
    assert_eq!(h.generation(), Some(2));
    assert_eq!(h.times(), [0, 1]);
    advance(1).await;
    // ...and retried after the first backoff, without a trigger.
    assert_eq!(h.times(), [0, 1, 2]);
    assert_eq!(h.generation(), Some(3));
    assert_eq!(h.count(Outcome::Published), 3);
    task.abort();
}
