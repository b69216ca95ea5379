use super::*;

const LEASE: &str = "00112233445566778899aabbccddeeff";

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[test]
fn rounds() {
    let table = [
        (false, false, Round::Stage),
        (true, false, Round::Idle("staged")),
        (false, true, Round::Idle("imported")),
        (true, true, Round::Idle("imported")),
    ];
    for (staged, imported, want) in table {
        assert_eq!(
            round(staged, imported),
            want,
            "staged {staged}, imported {imported}"
        );
    }
}

#[test]
fn answers() {
    let lease = Lease::parse(LEASE).unwrap();
    let refused = |ra| SlotAnswer::Refused {
        retry_after: ra,
        reason: "full".to_owned(),
        in_use: Some(2),
        slots: Some(2),
    };
    // (answer, --without-slots, r, what follows)
    let table = [
        (
            SlotAnswer::Granted {
                lease: lease.clone(),
                ttl: s(60),
            },
            false,
            0.0,
            Next::Stage {
                lease: lease.clone(),
                ttl: s(60),
            },
        ),
        (refused(Some(s(4))), false, 0.0, Next::WaitForSlot(s(4))),
        (
            refused(Some(s(4))),
            false,
            0.5,
            Next::WaitForSlot(s(4) + s(4).mul_f64(0.125)),
        ),
        (refused(None), false, 0.0, Next::WaitForSlot(s(1))),
        (refused(Some(s(0))), false, 0.0, Next::WaitForSlot(s(1))),
        (
            refused(Some(s(3600))),
            true,
            0.0,
            Next::WaitForSlot(MAX_SLOT_WAIT),
        ),
        (SlotAnswer::NoSlots, true, 0.0, Next::StageWithoutSlot),
    ];
    for (answer, without, r, want) in table {
        assert_eq!(
            after_answer(answer.clone(), without, r),
            want,
            "{answer:?} {without}"
        );
    }
    match after_answer(SlotAnswer::NoSlots, false, 0.0) {
        Next::Fail(why) => assert!(why.contains("--without-slots"), "{why}"),
        other => panic!("a server without slots, no --without-slots: {other:?}"),
    }
}

#[test]
fn slot_waits_stay_within_their_bounds() {
    for ra in [None, Some(s(0)), Some(s(1)), Some(s(30)), Some(s(86_400))] {
        for r in [0.0, 0.3, 0.999, 7.0, -1.0] {
            let w = slot_wait(ra, r);
            assert!(w >= MIN_SLOT_WAIT, "{ra:?} {r}: {w:?}");
            assert!(
                w <= MAX_SLOT_WAIT.mul_f64(1.0 + SLOT_WAIT_JITTER),
                "{ra:?} {r}: {w:?}"
            );
        }
    }
}

#[test]
fn renewals() {
    let ttl = s(60);
    // (attempt, since the last success, what follows)
    let table = [
        (
            Renewal::Renewed(s(60)),
            s(20),
            RenewNext::After(s(20), s(60)),
        ),
        (
            Renewal::Renewed(s(5)),
            s(1),
            RenewNext::After(Duration::from_millis(1666), s(5)),
        ),
        (Renewal::Renewed(s(2)), s(1), RenewNext::After(s(1), s(2))),
        (Renewal::Gone, s(1), RenewNext::Lost),
        (Renewal::Failed, s(20), RenewNext::After(s(10), ttl)),
        (Renewal::Failed, s(55), RenewNext::After(s(5), ttl)),
        (Renewal::Failed, s(60), RenewNext::Lost),
        (Renewal::Failed, s(61), RenewNext::Lost),
    ];
    for (attempt, since_ok, want) in table {
        let got = match after_renewal(attempt, since_ok, ttl) {
            RenewNext::After(d, t) => {
                RenewNext::After(Duration::from_millis(d.as_millis() as u64), t)
            }
            lost => lost,
        };
        assert_eq!(got, want, "{attempt:?} after {since_ok:?}");
    }
}

#[test]
fn failures_back_off_to_a_cap() {
    // (failures in a row, r, wait)
    let table = [
        (1, 1.0, s(5)),
        (1, 0.0, Duration::from_millis(2500)),
        (2, 1.0, s(10)),
        (4, 1.0, s(40)),
        (7, 1.0, s(300)),
        (40, 1.0, s(300)),
        (0, 1.0, s(5)),
    ];
    for (n, r, want) in table {
        assert_eq!(failure_backoff(n, r), want, "{n} failures, r {r}");
    }
}

#[test]
fn polls() {
    let table = [(s(60), 0.0, s(60)), (s(60), 0.5, s(57)), (s(10), 2.0, s(9))];
    for (interval, r, want) in table {
        assert_eq!(next_poll(interval, r), want, "{interval:?} {r}");
    }
}
