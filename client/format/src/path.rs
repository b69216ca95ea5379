//! The URL grammar of an ostree archive repo served over HTTP. Parsing is
//! strict: anything that is not exactly a name ostree itself would request
//! is `None`, which is what makes path traversal impossible by construction
//! (no `..`, no empty or dot components, no percent-decoding surprises).

use crate::checksum::Checksum;
use crate::refname;

/// What kind of object a loose archive object file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Commit,
    DirTree,
    DirMeta,
    /// Content object, zlib-compressed with its header (archive mode).
    File,
    /// Detached commit metadata (signatures). Not content-addressed: it may
    /// change while the commit stays.
    CommitMeta,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 5] = [
        ObjectKind::Commit,
        ObjectKind::DirTree,
        ObjectKind::DirMeta,
        ObjectKind::File,
        ObjectKind::CommitMeta,
    ];

    /// File extension in an archive repo.
    pub fn extension(self) -> &'static str {
        match self {
            ObjectKind::Commit => "commit",
            ObjectKind::DirTree => "dirtree",
            ObjectKind::DirMeta => "dirmeta",
            ObjectKind::File => "filez",
            ObjectKind::CommitMeta => "commitmeta",
        }
    }

    pub fn from_extension(ext: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.extension() == ext)
    }

    /// Whether the bytes at this name can never change (content-addressed).
    pub fn is_immutable(self) -> bool {
        !matches!(self, ObjectKind::CommitMeta)
    }
}

/// A loose object's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName {
    pub checksum: Checksum,
    pub kind: ObjectKind,
}

impl ObjectName {
    pub fn new(checksum: Checksum, kind: ObjectKind) -> Self {
        Self { checksum, kind }
    }

    /// `objects/ab/cdef….ext`, relative to the repo root.
    pub fn path(&self) -> String {
        let mut buf = [0u8; Self::PATH_MAX];
        self.path_in(&mut buf).to_owned()
    }

    /// The longest [`ObjectName::file_name`]: 62 hex digits, a dot, the
    /// longest extension.
    pub const FILE_NAME_MAX: usize = 80;

    /// The longest [`ObjectName::path`]: `objects/ab/` and the longest
    /// file name.
    pub const PATH_MAX: usize = 11 + Self::FILE_NAME_MAX;

    /// [`ObjectName::path`], written into `buf` (the server logs one per
    /// object request): the one spelling of an object's path.
    pub fn path_in<'b>(&self, buf: &'b mut [u8; Self::PATH_MAX]) -> &'b str {
        let (dir, file) = buf.split_at_mut(11);
        dir[..8].copy_from_slice(b"objects/");
        hex::encode_to_slice(&self.checksum.as_bytes()[..1], &mut dir[8..10])
            .expect("2 hex digits hold a byte");
        dir[10] = b'/';
        let file: &mut [u8; Self::FILE_NAME_MAX] =
            file.try_into().expect("the rest is a file name");
        let len = 11 + self.file_name(file).len();
        std::str::from_utf8(&buf[..len]).expect("a path of hex and an extension is ASCII")
    }

    /// `objects/ab`, the fan-out directory [`ObjectName::path`] is in.
    pub fn fanout_dir(&self) -> String {
        let mut buf = [0u8; Self::PATH_MAX];
        self.path_in(&mut buf)[.."objects/ab".len()].to_owned()
    }

    /// `cdef….ext`, the file name [`ObjectName::path`] ends with, written
    /// into `buf`: the server opens one per object request, in its held
    /// fan-out directory, without allocating.
    pub fn file_name<'b>(&self, buf: &'b mut [u8; Self::FILE_NAME_MAX]) -> &'b str {
        let rest = &self.checksum.as_bytes()[1..];
        let ext = self.kind.extension().as_bytes();
        let (hex, tail) = buf.split_at_mut(2 * rest.len());
        hex::encode_to_slice(rest, hex).expect("twice the bytes hold their hex");
        tail[0] = b'.';
        tail[1..=ext.len()].copy_from_slice(ext);
        let len = hex.len() + 1 + ext.len();
        std::str::from_utf8(&buf[..len]).expect("hex and an extension are ASCII")
    }
}

/// `refs/heads` or `refs/mirrors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefNamespace {
    Heads,
    /// `refs/mirrors/<collection-id>/<ref>`.
    Mirrors,
}

impl RefNamespace {
    pub fn dir(self) -> &'static str {
        match self {
            RefNamespace::Heads => "refs/heads",
            RefNamespace::Mirrors => "refs/mirrors",
        }
    }
}

/// A static delta: from a commit (or from nothing) to a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeltaName {
    pub from: Option<Checksum>,
    pub to: Checksum,
}

impl DeltaName {
    /// The name used in the summary's `ostree.static-deltas`: hex `FROM-TO`
    /// or `TO`.
    pub fn summary_name(&self) -> String {
        match self.from {
            Some(f) => format!("{}-{}", f.to_hex(), self.to.to_hex()),
            None => self.to.to_hex(),
        }
    }

    pub fn parse_summary_name(s: &str) -> Option<Self> {
        match s.split_once('-') {
            Some((f, t)) => Some(Self {
                from: Some(Checksum::from_hex(f).ok()?),
                to: Checksum::from_hex(t).ok()?,
            }),
            None => Some(Self {
                from: None,
                to: Checksum::from_hex(s).ok()?,
            }),
        }
    }

    /// The directory relative to the repo root: `deltas/XX/REST` where
    /// `XXREST` is `mb64(from)-mb64(to)` or `mb64(to)`.
    pub fn dir(&self) -> String {
        self.dir_and(&[])
    }

    /// [`DeltaName::dir`] followed by `suffix`, made to its length.
    fn dir_and(&self, suffix: &[&str]) -> String {
        let mut joined = String::with_capacity(2 * Checksum::MBASE64_LEN + 1);
        if let Some(f) = self.from {
            f.write_mbase64(&mut joined);
            joined.push('-');
        }
        self.to.write_mbase64(&mut joined);
        fanned("deltas", &joined, suffix)
    }

    fn parse_dir(prefix: &str, rest: &str) -> Option<Self> {
        let mut buf = [0u8; 2 * Checksum::MBASE64_LEN + 1];
        let joined = rejoin(&mut buf, prefix, rest)?;
        match joined.split_once('-') {
            Some((f, t)) => Some(Self {
                from: Some(Checksum::from_mbase64(f).ok()?),
                to: Checksum::from_mbase64(t).ok()?,
            }),
            None => Some(Self {
                from: None,
                to: Checksum::from_mbase64(joined).ok()?,
            }),
        }
    }

    /// `delta-indexes/XX/REST.index` for the target commit.
    pub fn index_path(to: &Checksum) -> String {
        fanned("delta-indexes", &to.to_mbase64(), &[".index"])
    }
}

/// `dir/XX/REST` and the `suffix` pieces, for a name `XXREST`, in one
/// allocation: how objects, deltas and delta indexes are laid out, named
/// at every request for one. [`rejoin`] is the way back.
fn fanned(dir: &str, name: &str, suffix: &[&str]) -> String {
    let (head, rest) = name.split_at(2);
    let len = dir.len() + name.len() + 2 + suffix.iter().map(|s| s.len()).sum::<usize>();
    let mut p = String::with_capacity(len);
    for piece in [dir, "/", head, "/", rest].iter().chain(suffix) {
        p.push_str(piece);
    }
    p
}

/// A name split after its first two characters (`XX/REST`) made whole
/// again in `buf`, without allocating: parsed at every request for a
/// delta. `None` unless `prefix` is those two characters and the whole
/// fits.
fn rejoin<'a>(buf: &'a mut [u8], prefix: &str, rest: &str) -> Option<&'a str> {
    if prefix.len() != 2 {
        return None;
    }
    let joined = buf.get_mut(..prefix.len() + rest.len())?;
    let (head, tail) = joined.split_at_mut(prefix.len());
    head.copy_from_slice(prefix.as_bytes());
    tail.copy_from_slice(rest.as_bytes());
    std::str::from_utf8(joined).ok()
}

/// A file inside a delta directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeltaFile {
    Superblock,
    /// Numbered part `0`, `1`, ...
    Part(u32),
}

/// Parts beyond this index are refused as nonsense (ostree splits at
/// `max-chunk-size`, 32 MiB by default, so this allows multi-TiB deltas).
const MAX_DELTA_PART: u32 = 1 << 20;

/// Where [`RepoPath::Blob`]s are, as an OCI layout keeps them.
const BLOBS_DIR: &str = "blobs/sha256/";

/// Every path an ostree client may request from an archive remote.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RepoPath {
    Config,
    Summary,
    SummarySig,
    Ref {
        namespace: RefNamespace,
        name: String,
    },
    Object(ObjectName),
    Delta {
        name: DeltaName,
        file: DeltaFile,
    },
    DeltaIndex {
        to: Checksum,
    },
    /// `blobs/sha256/<hex>`: an ostree-native image's manifest or config,
    /// by its OCI digest, for staging (see [`crate::staging`]).
    /// Content-addressed, so immutable.
    Blob(Checksum),
}

impl RepoPath {
    /// Parses a request path relative to the repo root (no leading `/`,
    /// already split from any query string). The path is matched as raw
    /// bytes: a `%` anywhere is refused, since no valid ostree name needs
    /// percent-encoding, and a literal `+` stays a `+`.
    pub fn parse(p: &str) -> Option<Self> {
        if p.contains('%') || p.contains('\\') || p.contains('\0') {
            return None;
        }
        match p {
            "config" => return Some(RepoPath::Config),
            "summary" => return Some(RepoPath::Summary),
            "summary.sig" => return Some(RepoPath::SummarySig),
            _ => {}
        }
        if let Some(rest) = p.strip_prefix("refs/heads/") {
            refname::validate_ref(rest).ok()?;
            return Some(RepoPath::Ref {
                namespace: RefNamespace::Heads,
                name: rest.to_owned(),
            });
        }
        if let Some(rest) = p.strip_prefix("refs/mirrors/") {
            let (cid, r) = rest.split_once('/')?;
            refname::validate_collection_id(cid).ok()?;
            refname::validate_ref(r).ok()?;
            return Some(RepoPath::Ref {
                namespace: RefNamespace::Mirrors,
                name: rest.to_owned(),
            });
        }
        if let Some(rest) = p.strip_prefix("objects/") {
            let (prefix, file) = rest.split_once('/')?;
            let (tail, ext) = file.split_once('.')?;
            if tail.len() != Checksum::HEX_LEN - 2 {
                return None;
            }
            let mut buf = [0u8; Checksum::HEX_LEN];
            let checksum = Checksum::from_hex(rejoin(&mut buf, prefix, tail)?).ok()?;
            let kind = ObjectKind::from_extension(ext)?;
            return Some(RepoPath::Object(ObjectName { checksum, kind }));
        }
        if let Some(rest) = p.strip_prefix("deltas/") {
            let mut it = rest.split('/');
            let (prefix, dir, file) = (it.next()?, it.next()?, it.next()?);
            if it.next().is_some() {
                return None;
            }
            let name = DeltaName::parse_dir(prefix, dir)?;
            let file = match file {
                "superblock" => DeltaFile::Superblock,
                n if !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && (n == "0" || !n.starts_with('0')) =>
                {
                    let i: u32 = n.parse().ok()?;
                    if i > MAX_DELTA_PART {
                        return None;
                    }
                    DeltaFile::Part(i)
                }
                _ => return None,
            };
            return Some(RepoPath::Delta { name, file });
        }
        if let Some(rest) = p.strip_prefix("delta-indexes/") {
            let (prefix, file) = rest.split_once('/')?;
            let tail = file.strip_suffix(".index")?;
            if prefix.len() != 2 || tail.contains('-') {
                return None;
            }
            let mut buf = [0u8; Checksum::MBASE64_LEN];
            let to = Checksum::from_mbase64(rejoin(&mut buf, prefix, tail)?).ok()?;
            return Some(RepoPath::DeltaIndex { to });
        }
        if let Some(hex) = p.strip_prefix(BLOBS_DIR) {
            return Some(RepoPath::Blob(Checksum::from_hex(hex).ok()?));
        }
        None
    }

    /// The path relative to the repo root; `parse(p.to_path()) == Some(p)`.
    pub fn to_path(&self) -> String {
        match self {
            RepoPath::Config => "config".into(),
            RepoPath::Summary => "summary".into(),
            RepoPath::SummarySig => "summary.sig".into(),
            RepoPath::Ref { namespace, name } => format!("{}/{name}", namespace.dir()),
            RepoPath::Object(o) => o.path(),
            // Made to its length, not formatted: the server makes one at
            // every delta request.
            RepoPath::Delta { name, file } => match file {
                DeltaFile::Superblock => name.dir_and(&["/superblock"]),
                DeltaFile::Part(i) => {
                    let mut digits = [0u8; 20];
                    name.dir_and(&["/", crate::digits::decimal(&mut digits, u64::from(*i))])
                }
            },
            RepoPath::DeltaIndex { to } => DeltaName::index_path(to),
            RepoPath::Blob(d) => format!("{BLOBS_DIR}{}", d.to_hex()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C1: &str = "79b3851e461df41725439c6af027d66b542a92a3691494a86328f9f2d4792dd2";
    const C2: &str = "527043be2e20e17239bd19986592e4f0cc9bcfd00c24766fbb8fe75dee1fe8d0";
    // Real paths written by `ostree static-delta generate` (2022.7).
    const DELTA_FROM: &str =
        "deltas/eb/OFHkYd9BclQ5xq8CfWa1QqkqNpFJSoYyj58tR5LdI-UnBDvi4g4XI5vRmYZZLk8Mybz9AMJHZvu4_nXe4f6NA/superblock";
    const DELTA_EMPTY: &str = "deltas/Un/BDvi4g4XI5vRmYZZLk8Mybz9AMJHZvu4_nXe4f6NA/0";
    const INDEX: &str = "delta-indexes/Un/BDvi4g4XI5vRmYZZLk8Mybz9AMJHZvu4_nXe4f6NA.index";

    #[test]
    fn accepts_every_ostree_name() {
        let c1 = Checksum::from_hex(C1).unwrap();
        let c2 = Checksum::from_hex(C2).unwrap();
        let obj = |k| RepoPath::Object(ObjectName::new(c1, k));
        let cases: Vec<(String, RepoPath)> = vec![
            ("config".into(), RepoPath::Config),
            ("summary".into(), RepoPath::Summary),
            ("summary.sig".into(), RepoPath::SummarySig),
            (
                "refs/heads/fedora/x86_64/coreos/stable".into(),
                RepoPath::Ref {
                    namespace: RefNamespace::Heads,
                    name: "fedora/x86_64/coreos/stable".into(),
                },
            ),
            (
                "refs/mirrors/org.example.Os/os/stable".into(),
                RepoPath::Ref {
                    namespace: RefNamespace::Mirrors,
                    name: "org.example.Os/os/stable".into(),
                },
            ),
            (
                format!("objects/79/{}.commit", &C1[2..]),
                obj(ObjectKind::Commit),
            ),
            (
                format!("objects/79/{}.dirtree", &C1[2..]),
                obj(ObjectKind::DirTree),
            ),
            (
                format!("objects/79/{}.dirmeta", &C1[2..]),
                obj(ObjectKind::DirMeta),
            ),
            (
                format!("objects/79/{}.filez", &C1[2..]),
                obj(ObjectKind::File),
            ),
            (
                format!("objects/79/{}.commitmeta", &C1[2..]),
                obj(ObjectKind::CommitMeta),
            ),
            (
                DELTA_FROM.into(),
                RepoPath::Delta {
                    name: DeltaName {
                        from: Some(c1),
                        to: c2,
                    },
                    file: DeltaFile::Superblock,
                },
            ),
            (
                DELTA_EMPTY.into(),
                RepoPath::Delta {
                    name: DeltaName { from: None, to: c2 },
                    file: DeltaFile::Part(0),
                },
            ),
            (INDEX.into(), RepoPath::DeltaIndex { to: c2 }),
            (format!("blobs/sha256/{C2}"), RepoPath::Blob(c2)),
        ];
        let parts = [7, 10, 909, MAX_DELTA_PART].map(|i| {
            let p = DELTA_EMPTY.strip_suffix('0').unwrap();
            (
                format!("{p}{i}"),
                RepoPath::Delta {
                    name: DeltaName { from: None, to: c2 },
                    file: DeltaFile::Part(i),
                },
            )
        });
        for (p, want) in cases.into_iter().chain(parts) {
            assert_eq!(RepoPath::parse(&p), Some(want.clone()), "{p}");
            assert_eq!(want.to_path(), p, "round trip of {p}");
        }
    }

    #[test]
    fn an_object_path_is_its_fan_out_directory_and_file_name() {
        for kind in ObjectKind::ALL {
            let o = ObjectName::new(Checksum::digest(kind.extension().as_bytes()), kind);
            let mut buf = [0u8; ObjectName::FILE_NAME_MAX];
            let (dir, name) = (o.fanout_dir(), o.file_name(&mut buf));
            let hex = o.checksum.to_hex();
            let spelled = format!("objects/{}/{}.{}", &hex[..2], &hex[2..], kind.extension());
            assert_eq!(o.path(), spelled);
            assert_eq!(o.path(), format!("{dir}/{name}"));
            assert_eq!(dir, format!("objects/{}", &hex[..2]));
            assert_eq!(RepoPath::parse(&o.path()), Some(RepoPath::Object(o)));
        }
    }

    #[test]
    fn refuses_everything_else() {
        let cases: Vec<String> = vec![
            "".into(),
            "/".into(),
            "objects".into(),
            "objects/".into(),
            "refs/heads/".into(),
            "refs/heads/../config".into(),
            "refs/heads/a/../../config".into(),
            "refs/heads/.hidden".into(),
            "refs/heads/a//b".into(),
            "refs/heads/a/".into(),
            "refs/remotes/origin/x".into(),
            "refs/mirrors/notacollection/x".into(),
            "summary.sig.bak".into(),
            "config/".into(),
            "%2e%2e/etc/passwd".into(),
            "refs/heads/%2e%2e".into(),
            "tmp/cache".into(),
            "state/x".into(),
            format!("objects/79/{}.commit/", &C1[2..]),
            format!("objects/79/{}.file", &C1[2..]),
            format!("objects/79/{}.commit-tombstone", &C1[2..]),
            format!("objects/7/9{}.commit", &C1[2..]),
            format!("objects/79/{}.commit", &C1[2..].to_uppercase()),
            format!("objects/../{}.commit", &C1[2..]),
            format!("{DELTA_FROM}/x"),
            DELTA_EMPTY.replace("/0", "/01"),
            DELTA_EMPTY.replace("/0", "/-1"),
            DELTA_EMPTY.replace("/0", "/99999999999"),
            DELTA_EMPTY.replace("/0", "/.."),
            INDEX.replace(".index", ""),
            "blobs/sha256/".into(),
            format!("blobs/sha256/{}", &C1[1..]),
            format!("blobs/sha256/{}", C1.to_uppercase()),
            format!("blobs/sha256/{C1}/"),
            format!("blobs/sha512/{C1}"),
            format!("blobs/{C1}"),
        ];
        for p in cases {
            assert_eq!(RepoPath::parse(&p), None, "{p:?} accepted");
        }
    }
}
