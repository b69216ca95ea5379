//! Local sources: an OCI image layout directory (`oci:DIR[:TAG]`) and a tar
//! of one (`oci-archive:FILE[:TAG]`).
//!
//! The archive is never extracted: one pass over its tar headers records
//! where each file's bytes are, and blobs are then read in place. Either
//! way every blob goes through the same verification as a registry's.

use super::error::{SourceError, Subject};
use super::pipeline::{check_digest, Root, Store};
use super::verify;
use super::FetchOptions;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// `oci-layout` is one line of JSON.
const MAX_LAYOUT_FILE: u64 = 4096;

fn io_err(subject: &Subject, path: &Path, e: std::io::Error) -> SourceError {
    if e.kind() == std::io::ErrorKind::NotFound {
        SourceError::NotFound {
            subject: subject.clone(),
            reason: format!("{} does not exist", path.display()),
        }
    } else {
        SourceError::Io {
            subject: subject.clone(),
            path: path.display().to_string(),
            source: e,
        }
    }
}

fn check_layout_file(bytes: &[u8], subject: &Subject) -> Result<(), SourceError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Layout {
        image_layout_version: String,
    }
    let l: Layout = serde_json::from_slice(bytes).map_err(|e| SourceError::Invalid {
        subject: subject.clone(),
        reason: format!("oci-layout: {e}"),
    })?;
    if l.image_layout_version != "1.0.0" {
        return Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!("OCI layout version {:?}", l.image_layout_version),
        });
    }
    Ok(())
}

fn blob_rel(digest: &str) -> String {
    // Only called with checked sha256 digests: no path tricks possible.
    format!("blobs/sha256/{}", &digest["sha256:".len()..])
}

/// An OCI image layout directory.
pub struct LayoutStore {
    dir: PathBuf,
    tag: Option<String>,
}

impl LayoutStore {
    pub fn new(dir: &Path, tag: Option<String>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            tag,
        }
    }

    fn read_file(
        &self,
        rel: &str,
        max: u64,
        limit: &'static str,
        subject: &Subject,
    ) -> Result<Vec<u8>, SourceError> {
        let p = self.dir.join(rel);
        let f = File::open(&p).map_err(|e| io_err(subject, &p, e))?;
        verify::read_bounded(f, subject, &p.display().to_string(), max, limit)
    }
}

impl Store for LayoutStore {
    fn root(&mut self, subject: &Subject, opts: &FetchOptions) -> Result<Root, SourceError> {
        let layout = self.read_file("oci-layout", MAX_LAYOUT_FILE, "oci-layout size", subject)?;
        check_layout_file(&layout, subject)?;
        let bytes = self.read_file(
            "index.json",
            opts.limits.max_manifest_bytes,
            "index.json size",
            subject,
        )?;
        Ok(Root::LayoutIndex {
            bytes,
            tag: self.tag.clone(),
        })
    }

    fn blob(
        &mut self,
        digest: &str,
        subject: &Subject,
    ) -> Result<(Box<dyn Read + '_>, String), SourceError> {
        check_digest(digest, subject)?;
        let p = self.dir.join(blob_rel(digest));
        let f = File::open(&p).map_err(|e| io_err(subject, &p, e))?;
        Ok((Box::new(f), p.display().to_string()))
    }
}

/// A tar of an OCI image layout, read in place.
pub struct ArchiveStore {
    path: PathBuf,
    file: File,
    tag: Option<String>,
    /// Regular files: path → (data offset, size).
    entries: HashMap<String, (u64, u64)>,
}

impl ArchiveStore {
    pub fn open(
        path: &Path,
        tag: Option<String>,
        subject: &Subject,
        opts: &FetchOptions,
    ) -> Result<Self, SourceError> {
        let file = File::open(path).map_err(|e| io_err(subject, path, e))?;
        let invalid = |e: std::io::Error| SourceError::Invalid {
            subject: subject.clone(),
            reason: format!("archive: {e}"),
        };
        let mut entries = HashMap::new();
        {
            let mut archive = tar::Archive::new(&file);
            // Raw: extension headers are plain entries (never read into
            // memory); the names we look for fit in a ustar header.
            let iter = archive.entries_with_seek().map_err(invalid)?.raw(true);
            for (n, e) in iter.enumerate() {
                if n as u64 >= opts.limits.max_entries {
                    return Err(SourceError::LimitExceeded {
                        subject: subject.clone(),
                        limit: "archive entries",
                        detail: format!("more than {} entries", opts.limits.max_entries),
                    });
                }
                let e = e.map_err(invalid)?;
                if !matches!(
                    e.header().entry_type(),
                    tar::EntryType::Regular | tar::EntryType::Continuous
                ) {
                    continue;
                }
                let name = String::from_utf8_lossy(&e.header().path_bytes()).into_owned();
                let name = name.trim_start_matches("./").to_owned();
                entries.insert(name, (e.raw_file_position(), e.size()));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            tag,
            entries,
        })
    }

    fn open_entry(
        &self,
        rel: &str,
        subject: &Subject,
    ) -> Result<(std::io::Take<File>, u64), SourceError> {
        let &(offset, size) = self.entries.get(rel).ok_or_else(|| SourceError::NotFound {
            subject: subject.clone(),
            reason: format!("{rel} is not in {}", self.path.display()),
        })?;
        let mut f = self
            .file
            .try_clone()
            .map_err(|e| io_err(subject, &self.path, e))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| io_err(subject, &self.path, e))?;
        Ok((f.take(size), size))
    }

    fn origin(&self, rel: &str) -> String {
        format!("{}:{rel}", self.path.display())
    }
}

impl Store for ArchiveStore {
    fn root(&mut self, subject: &Subject, opts: &FetchOptions) -> Result<Root, SourceError> {
        let (f, _) = self.open_entry("oci-layout", subject)?;
        let layout = verify::read_bounded(
            f,
            subject,
            &self.origin("oci-layout"),
            MAX_LAYOUT_FILE,
            "oci-layout size",
        )?;
        check_layout_file(&layout, subject)?;
        let (f, _) = self.open_entry("index.json", subject)?;
        let bytes = verify::read_bounded(
            f,
            subject,
            &self.origin("index.json"),
            opts.limits.max_manifest_bytes,
            "index.json size",
        )?;
        Ok(Root::LayoutIndex {
            bytes,
            tag: self.tag.clone(),
        })
    }

    fn blob(
        &mut self,
        digest: &str,
        subject: &Subject,
    ) -> Result<(Box<dyn Read + '_>, String), SourceError> {
        check_digest(digest, subject)?;
        let rel = blob_rel(digest);
        let (f, _) = self.open_entry(&rel, subject)?;
        Ok((Box::new(f), self.origin(&rel)))
    }
}
