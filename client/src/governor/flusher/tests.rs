use super::*;

fn file_of(dir: &std::path::Path, name: &str, len: usize) -> File {
    let p = dir.join(name);
    std::fs::write(&p, vec![1u8; len]).unwrap();
    File::open(&p).unwrap()
}

fn state(batch: u64, object_cost: u64, items: &[u64], dir: &std::path::Path) -> State {
    let mut cfg = AimdConfig::new(Duration::from_millis(10));
    cfg.initial_batch = batch;
    cfg.object_cost = object_cost;
    let mut st = State::new(cfg, COMMIT_GAP);
    for (n, &len) in items.iter().enumerate() {
        st.queue.push_back(Item {
            file: file_of(dir, &n.to_string(), len as usize),
            offset: 0,
            len,
            split: false,
        });
    }
    st
}

#[test]
fn chunks_split_big_files_and_group_small_ones() {
    let dir = tempfile::tempdir().unwrap();
    const K: u64 = 1024;
    // (chunk cost, cost per object, queued file sizes, expected chunks
    // as (offset, len) lists)
    type Case = (u64, u64, &'static [u64], &'static [&'static [(u64, u64)]]);
    let cases: &[Case] = &[
        (
            256 * K,
            0,
            &[100 * K, 100 * K, 100 * K],
            &[
                &[(0, 100 * K), (0, 100 * K), (0, 56 * K)],
                &[(56 * K, 44 * K)],
            ],
        ),
        (
            256 * K,
            0,
            &[600 * K],
            &[&[(0, 256 * K)], &[(256 * K, 256 * K)], &[(512 * K, 88 * K)]],
        ),
        (
            256 * K,
            0,
            &[10 * K, 600 * K],
            &[
                &[(0, 10 * K), (0, 244 * K)],
                &[(244 * K, 256 * K)],
                &[(500 * K, 100 * K)],
            ],
        ),
        (
            256 * K,
            0,
            &[1; 2 * CHUNK_MAX_FILES + 8],
            &[
                &[(0, 1); CHUNK_MAX_FILES],
                &[(0, 1); CHUNK_MAX_FILES],
                &[(0, 1); 8],
            ],
        ),
        // A create costs 16 KiB: the third file's first part carries
        // its create and 8 KiB of data, the rest costs its bytes only.
        (
            256 * K,
            16 * K,
            &[100 * K, 100 * K, 100 * K],
            &[
                &[(0, 100 * K), (0, 100 * K), (0, 8 * K)],
                &[(8 * K, 92 * K)],
            ],
        ),
        // Empty files are paced by their creates alone.
        (
            64 * K,
            16 * K,
            &[0; 10],
            &[&[(0, 0); 4], &[(0, 0); 4], &[(0, 0); 2]],
        ),
    ];
    for (batch, object_cost, items, want) in cases {
        let mut st = state(*batch, *object_cost, items, dir.path());
        let mut got = Vec::new();
        while !st.queue.is_empty() {
            let c = st.take_chunk();
            got.push(c.iter().map(|i| (i.offset, i.len)).collect::<Vec<_>>());
        }
        let want: Vec<Vec<_>> = want.iter().map(|c| c.to_vec()).collect();
        assert_eq!(got, want, "chunk {batch}, items {items:?}");
    }
}

#[test]
fn flushes_everything_submitted() {
    let dir = tempfile::tempdir().unwrap();
    let config = AimdConfig::new(Duration::from_millis(10));
    let ceiling_kib = config.max_batch >> 10;
    let f = Flusher::start_with_gap(config, Duration::ZERO).unwrap();
    for i in 0..20 {
        f.submit(file_of(dir.path(), &i.to_string(), 300 << 10), 300 << 10)
            .unwrap();
    }
    for i in 0..200 {
        f.submit(file_of(dir.path(), &format!("e{i}"), 0), 0)
            .unwrap();
    }
    f.drain().unwrap();
    let (s, _) = f.stats();
    // 6000 KiB and 220 creates in chunks of at most the chunk ceiling
    // and CHUNK_MAX_FILES files.
    let most = CHUNK_MAX_FILES as u64;
    assert!(
        s.flushes >= 6000 / ceiling_kib + 200 / most,
        "{} flushes",
        s.flushes
    );
    // The journal was committed at least once per LOG_FORCE_OBJECTS
    // objects (the rest is the barrier's), at most once more per
    // LOG_FORCE_BYTES of data, and the one writer never ran more than
    // the bound (plus its own object) ahead of the commits.
    let by_bytes = (6000 << 10) / LOG_FORCE_BYTES;
    assert!(
        s.log_forces >= 220 / LOG_FORCE_OBJECTS,
        "{} log forces",
        s.log_forces
    );
    assert!(s.log_forces <= 220 / LOG_FORCE_OBJECTS + by_bytes + 1);
    assert!(s.log_forces <= s.flushes);
    assert!(
        s.max_unforced <= MAX_UNFORCED + 1,
        "{} objects uncommitted at once",
        s.max_unforced
    );
    assert_eq!(f.shared.lock().backlog, 0);
    assert_eq!(s.samples.len() as u64, s.flushes);
}

#[test]
fn commits_fall_due_by_objects_or_by_data() {
    const M: u64 = 1 << 20;
    let l = LOG_FORCE_OBJECTS;
    let g = COMMIT_GAP;
    let first = None;
    let soon = Some(g / 2);
    let later = Some(g);
    // (new objects in the chunk, objects flushed since the last commit,
    // data since the last commit, time since the last commit, due)
    let cases = [
        (1, 1, 0, first, false),
        (32, l - 1, M, later, false),
        (32, l, M, first, true),
        (32, l, M, later, true),
        (1, l + 40, 0, later, true),
        // The rest of a big file: no create to commit, however many
        // objects are waiting...
        (0, l + 40, M, later, false),
        // ...but its data is bounded all the same.
        (0, 0, LOG_FORCE_BYTES, later, true),
        (3, 3, LOG_FORCE_BYTES + 1, first, true),
        // Nothing is due within the gap, by objects or by data.
        (32, l + 40, M, soon, false),
        (0, 0, 4 * LOG_FORCE_BYTES, soon, false),
    ];
    for (objects, flushed, bytes, since, due) in cases {
        assert_eq!(
            commit_due(objects, flushed, bytes, since, g),
            due,
            "{objects} objects in the chunk, {flushed} flushed, {bytes} bytes, {since:?}"
        );
    }
}

#[test]
fn a_big_file_is_committed_as_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    // No gap: on a tmpfs the whole file takes a few milliseconds.
    let f = Flusher::start_with_gap(AimdConfig::new(Duration::from_millis(10)), Duration::ZERO)
        .unwrap();
    // Two objects, far below LOG_FORCE_OBJECTS: every commit here is
    // one that LOG_FORCE_BYTES made due, most of them in the middle
    // of the big file, where only the small one can be synced.
    let big = 4 * LOG_FORCE_BYTES;
    f.submit(file_of(dir.path(), "small", 4096), 4096).unwrap();
    f.submit(file_of(dir.path(), "big", big as usize), big)
        .unwrap();
    f.drain().unwrap();
    let (s, _) = f.stats();
    assert!(s.log_forces >= 3, "{} commits", s.log_forces);
    assert!(s.log_forces <= big / LOG_FORCE_BYTES + 1);
}
