//! One refused image must not hold the others back: when the set of
//! images as a check found them is refused (a ref moved back in time, a
//! signature that does not verify), each moved image is tried on top of
//! what is served, in order, and keeps its new release only if that set
//! is accepted. A refused image keeps its previous release (or, never
//! published, is left out); the others move forward. At most one attempt
//! per moved image, after the whole set (pure: the attempt is the
//! caller's).

/// What one attempt at publishing a set gave.
#[derive(Debug)]
pub enum Tried<G, R> {
    Published(G),
    /// Refused for what the set holds; `R` says why.
    Refused(R),
}

/// What the search found.
#[derive(Debug)]
pub struct Chosen<G, R> {
    /// Which images take their new release (the others their previous
    /// one), and the generation of that set; `None` if no set with a new
    /// release was accepted.
    pub published: Option<(Vec<bool>, G)>,
    /// The moved images whose new release was refused, and why.
    pub refused: Vec<(usize, R)>,
    /// Why the whole set was refused when no image moved (only their
    /// previous releases were tried: new signatures, say).
    pub unattributed: Option<R>,
}

/// Finds the sets to publish. `moved[i]`: image `i` has a new release to
/// offer. `attempt(take)` publishes the set where image `i` has its new
/// release if `take[i]`, else its previous one; an error from it (not a
/// refusal) ends the search.
pub fn choose<G, R, E>(
    moved: &[bool],
    mut attempt: impl FnMut(&[bool]) -> Result<Tried<G, R>, E>,
) -> Result<Chosen<G, R>, E> {
    let whole = match attempt(moved)? {
        Tried::Published(g) => {
            return Ok(Chosen {
                published: Some((moved.to_vec(), g)),
                refused: Vec::new(),
                unattributed: None,
            })
        }
        Tried::Refused(why) => why,
    };
    let idx: Vec<usize> = (0..moved.len()).filter(|&i| moved[i]).collect();
    if idx.is_empty() {
        return Ok(Chosen {
            published: None,
            refused: Vec::new(),
            unattributed: Some(whole),
        });
    }
    let mut whole = Some(whole);
    let mut take = vec![false; moved.len()];
    let mut published = None;
    let mut refused = Vec::new();
    for (k, &i) in idx.iter().enumerate() {
        let last = k + 1 == idx.len();
        if last && refused.is_empty() {
            // Everything before it was accepted: this is the whole set,
            // refused already.
            if let Some(why) = whole.take() {
                refused.push((i, why));
            }
            break;
        }
        take[i] = true;
        match attempt(&take)? {
            Tried::Published(g) => published = Some((take.clone(), g)),
            Tried::Refused(why) => {
                take[i] = false;
                refused.push((i, why));
            }
        }
    }
    Ok(Chosen {
        published,
        refused,
        unattributed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What, which images moved, which new releases are refused (by
    /// themselves), the images taking their new release, the refused ones,
    /// and how many attempts that took.
    type Case = (
        &'static str,
        Vec<bool>,
        Vec<usize>,
        Option<Vec<bool>>,
        Vec<usize>,
        usize,
    );

    #[test]
    fn a_refused_image_keeps_its_release_and_the_others_move() {
        let (t, f) = (true, false);
        let cases: Vec<Case> = vec![
            (
                "all accepted",
                vec![t, t],
                vec![],
                Some(vec![t, t]),
                vec![],
                1,
            ),
            (
                "one of two refused",
                vec![t, t],
                vec![0],
                Some(vec![f, t]),
                vec![0],
                3,
            ),
            (
                "the last of two refused",
                vec![t, t],
                vec![1],
                Some(vec![t, f]),
                vec![1],
                2,
            ),
            ("both refused", vec![t, t], vec![0, 1], None, vec![0, 1], 3),
            (
                "the only one moved, refused",
                vec![f, t],
                vec![1],
                None,
                vec![1],
                1,
            ),
            (
                "nothing moved, refused (signatures)",
                vec![f, f],
                vec![],
                None,
                vec![],
                1,
            ),
            (
                "the middle of three",
                vec![t, t, t],
                vec![1],
                Some(vec![t, f, t]),
                vec![1],
                4,
            ),
        ];
        for (what, moved, bad, want_take, want_refused, want_attempts) in cases {
            let mut attempts = 0;
            let got = choose(&moved, |take: &[bool]| {
                attempts += 1;
                let refused =
                    moved.is_empty() || !moved.iter().any(|m| *m) || bad.iter().any(|&b| take[b]);
                anyhow::Ok(if refused {
                    Tried::Refused(())
                } else {
                    Tried::Published(take.to_vec())
                })
            })
            .unwrap();
            let took = got.published.map(|(t, g)| {
                assert_eq!(t, g, "{what}: the generation is of the set");
                t
            });
            assert_eq!(took, want_take, "{what}");
            let refused: Vec<usize> = got.refused.iter().map(|r| r.0).collect();
            assert_eq!(refused, want_refused, "{what}");
            let whole = moved.iter().all(|m| !m);
            assert_eq!(got.unattributed.is_some(), whole, "{what}: unattributed");
            assert_eq!(attempts, want_attempts, "{what}: attempts");
        }
    }

    #[test]
    fn an_error_ends_the_search() {
        let got = choose(&[true, true], |take: &[bool]| {
            if take == [true, true] {
                Ok(Tried::<(), ()>::Refused(()))
            } else {
                Err("disk full")
            }
        });
        assert_eq!(got.err(), Some("disk full"));
    }
}
