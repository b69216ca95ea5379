//! Step 5 of a stage: the object-set commits the importer's chunk-layer
//! refs name. Each is fetched (commit, then its one dirtree, each hashed
//! to its name), every object it lists is checked to be a content object
//! of the verified commit's closure, and the commit is recomputed locally
//! from that list ([`ObjectSet`]): only then are its dirmeta, dirtree and
//! commit written, through `pull`'s metadata writer (governor, free-space
//! reserve), the commit last so that its presence means the set is whole.

use super::chain::{Kind, Plan};
use crate::pull::error::{PullError, PullResult, Tag};
use crate::pull::walk::{self, Ctx};
use anyhow::anyhow;
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::staging::ObjectSet;
use oscontent_format::tree::{DIRMETA_GVARIANT_TYPE, DIRTREE_GVARIANT_TYPE, MAX_DIRTREE_SIZE};
use oscontent_format::{Checksum, Commit, ObjectKind, COMMIT_GVARIANT_TYPE};
use std::collections::HashSet;
use std::sync::Arc;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SetError {
    #[error("object set {id}: {why}")]
    Malformed { id: Checksum, why: String },
    #[error("object set {id} lists {object}, which is not a content object of commit {commit}")]
    OutsideClosure {
        id: Checksum,
        object: Checksum,
        commit: Checksum,
    },
    #[error("object set {id}: recomputed from the {objects} objects it lists, it is {recomputed}")]
    Recomputed {
        id: Checksum,
        objects: usize,
        recomputed: Checksum,
    },
}

/// One object to write: kind, checksum, bytes, GVariant type.
pub type Object = (ObjectKind, Checksum, Vec<u8>, &'static str);

/// Checks a served object set against the commit's content `closure` and
/// returns its objects to write, the commit last. `dirtree_bytes` is the
/// root tree of the commit served as `id` (both already hashed to their
/// names); the recomputed commit equal to `id` proves the rest of it.
pub fn check_set(
    id: Checksum,
    dirtree_bytes: &[u8],
    commit: Checksum,
    closure: &HashSet<Checksum>,
) -> Result<Vec<Object>, SetError> {
    let set = ObjectSet::from_dirtree(dirtree_bytes).map_err(|e| SetError::Malformed {
        id,
        why: e.to_string(),
    })?;
    if let Some(object) = set.iter().find(|o| !closure.contains(o)) {
        return Err(SetError::OutsideClosure {
            id,
            object: *object,
            commit,
        });
    }
    let built = set.build();
    if built.commit.checksum != id {
        return Err(SetError::Recomputed {
            id,
            objects: set.len(),
            recomputed: built.commit.checksum,
        });
    }
    Ok(vec![
        (
            ObjectKind::DirMeta,
            built.dirmeta.checksum,
            built.dirmeta.bytes,
            DIRMETA_GVARIANT_TYPE,
        ),
        (
            ObjectKind::DirTree,
            built.dirtree.checksum,
            built.dirtree.bytes,
            DIRTREE_GVARIANT_TYPE,
        ),
        (
            ObjectKind::Commit,
            built.commit.checksum,
            built.commit.bytes,
            COMMIT_GVARIANT_TYPE,
        ),
    ])
}

/// The content objects reachable from the (complete, verified) commit.
async fn content_closure(ctx: &Ctx, commit: Checksum) -> PullResult<HashSet<Checksum>> {
    let store = ctx.store();
    tokio::task::spawn_blocking(move || -> anyhow::Result<HashSet<Checksum>> {
        let all = store
            .repo
            .traverse_commit(&commit.to_hex(), 0, ostree::gio::Cancellable::NONE)
            .map_err(|e| anyhow!("traversing commit {commit}: {e}"))?;
        all.iter()
            .filter(|o| o.object_type() == ostree::ObjectType::File)
            .map(|o| Checksum::from_hex(o.checksum()).map_err(anyhow::Error::from))
            .collect()
    })
    .await
    .map_err(|e| PullError::LocalRepo(anyhow!("internal task failed: {e}")))?
    .local()
}

/// Fetches, checks and writes each object set of `plan` the repo lacks.
/// Returns (written, already present).
pub async fn stage_sets(ctx: &Arc<Ctx>, plan: &Plan) -> PullResult<(usize, usize)> {
    let ids: Vec<Checksum> = plan
        .layers
        .iter()
        .filter_map(|l| match l.kind {
            Kind::ObjectSet(c) => Some(c),
            _ => None,
        })
        .collect();
    let (mut written, mut present) = (0, 0);
    let mut closure = None;
    for id in ids {
        if ctx.present(ObjectKind::Commit, &id).await? {
            present += 1;
            continue;
        }
        if closure.is_none() {
            closure = Some(content_closure(ctx, plan.commit).await?);
        }
        let closure = closure.as_ref().expect("just computed");
        let fetcher = ctx.objects().await?;
        let cbytes =
            walk::fetch_metadata(fetcher, ObjectKind::Commit, &id, MAX_COMMIT_SIZE).await?;
        let root = Commit::parse(&cbytes)
            .map_err(|e| PullError::Verification(anyhow!("object set {id}: {e}")))?
            .root_tree;
        let tbytes =
            walk::fetch_metadata(fetcher, ObjectKind::DirTree, &root, MAX_DIRTREE_SIZE).await?;
        let objects = check_set(id, &tbytes, plan.commit, closure).verification()?;
        for (kind, c, bytes, ty) in objects {
            if !ctx.present(kind, &c).await? {
                walk::write_metadata(ctx, kind, c, bytes, ty).await?;
            }
        }
        written += 1;
    }
    Ok((written, present))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: u8) -> Checksum {
        Checksum::from_bytes(&[n; 32]).unwrap()
    }

    #[test]
    fn an_object_set_is_checked_against_the_closure_and_recomputed() {
        let closure: HashSet<Checksum> = [c(1), c(2), c(3)].into();
        let honest = ObjectSet::new([c(1), c(2)]).unwrap().build();
        let outside = ObjectSet::new([c(1), c(9)]).unwrap().build();
        let other = ObjectSet::new([c(3)]).unwrap().build();
        let id = honest.commit.checksum;
        let table: &[(&str, &[u8], Result<(), &str>)] = &[
            ("an honest set", &honest.dirtree.bytes, Ok(())),
            (
                "an object outside the closure",
                &outside.dirtree.bytes,
                Err("is not a content object of commit"),
            ),
            (
                "another set served under the id",
                &other.dirtree.bytes,
                Err("recomputed from the 1 objects"),
            ),
            ("bytes that are no dirtree", b"nonsense", Err("object set")),
        ];
        for (name, tree, want) in table {
            match (check_set(id, tree, c(7), &closure), want) {
                (Ok(objects), Ok(())) => {
                    let kinds: Vec<_> = objects.iter().map(|o| o.0).collect();
                    assert_eq!(
                        kinds,
                        [ObjectKind::DirMeta, ObjectKind::DirTree, ObjectKind::Commit]
                    );
                    for (_, sum, bytes, _) in &objects {
                        assert_eq!(&Checksum::digest(bytes), sum, "{name}");
                    }
                    assert_eq!(objects[2].1, id);
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{name}: {e}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
