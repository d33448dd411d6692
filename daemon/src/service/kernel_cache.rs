//! `io.gpuarch1.KernelCache`: the kernel cache's packages, builds and
//! jobs. Reads that touch the disk are admitted per sender and run on
//! their own blocking pool; root's operations on another, so root never
//! waits behind anyone's reads.

use std::sync::Arc;

use gpuarch_kernels::build::Fetch;
use gpuarch_wire::dbus::{KernelRecord, VerifyRecord};
use zbus::message::Header;
use zbus::{Connection, fdo, interface};

use super::admission::{Admission, READ_WORK, ROOT_WORK, blocking};
use super::authorize;

/// `io.gpuarch1.KernelCache`.
#[derive(Debug)]
pub struct KernelCache {
    pub cache: Arc<crate::cache::Cache>,
}

/// A kernel store that could not be read, as the caller sees it.
fn store_error(e: std::io::Error) -> fdo::Error {
    fdo::Error::IOError(format!("reading the kernel cache: {e}"))
}

impl KernelCache {
    /// The job of a Prewarm or Pull: `packages` for `archs` by `fetch`.
    async fn start_tasks(
        &self,
        packages: &[String],
        archs: &[String],
        fetch: Fetch,
        pin: bool,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        let tasks = self
            .cache
            .tasks(packages, archs)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        crate::cache::start_job(self.cache.clone(), tasks, fetch, pin)
            .await
            .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    fn remote_configured(&self) -> fdo::Result<()> {
        if self.cache.builder.remote().is_some() {
            return Ok(());
        }
        Err(fdo::Error::NotSupported(
            match &self.cache.cfg.remote {
                None => "no registry: kernels.remote is not set",
                Some(_) => "the registry in kernels.remote could not be used (journalctl -u gpuarchd says why)",
            }
            .into(),
        ))
    }
}

/// The package and arch lists of a request, within bounds.
fn request_lists(packages: Vec<&str>, archs: Vec<&str>) -> fdo::Result<(Vec<String>, Vec<String>)> {
    if packages.len() > 1024 || archs.len() > 64 {
        return Err(fdo::Error::InvalidArgs(format!(
            "{} packages and {} archs given; at most 1024 and 64",
            packages.len(),
            archs.len()
        )));
    }
    Ok((
        packages.into_iter().map(str::to_owned).collect(),
        archs.into_iter().map(str::to_owned).collect(),
    ))
}

/// The cache of kernel builds.
#[interface(name = "io.gpuarch1.KernelCache")]
impl KernelCache {
    /// Every stored build: key, package, version, variant, dtype, arch,
    /// toolkit, bytes, files, pinned, in_use, last_used, built_at, path.
    /// in_use is as of a scan of the mounts at most 5 s old. A caller with 4
    /// such reads in progress, or 32 in all, is answered LimitsExceeded.
    #[zbus(out_args("kernels"))]
    async fn list_kernels(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> fdo::Result<Vec<KernelRecord>> {
        let _admitted = Admission::take(Some(&hdr), "ListKernels")?;
        let c = self.cache.clone();
        blocking(&READ_WORK, move || c.list())
            .await?
            .map_err(store_error)
    }

    /// Build `packages` (empty: all) for `archs` (`sm_86` or `8.6`; empty:
    /// the host's GPUs), pinning what is built. Returns the job at once.
    /// For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn prewarm(
        &self,
        packages: Vec<&str>,
        archs: Vec<&str>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        // Sizes first: cheap, and says nothing about who may call.
        let (packages, archs) = request_lists(packages, archs)?;
        authorize(conn, &hdr, "Prewarm").await?;
        self.start_tasks(&packages, &archs, Fetch::Build, true)
            .await
    }

    /// As Prewarm, but only from the registry (`kernels.remote`): nothing
    /// is built here. Pins what it pulls when `pin`. Returns the job at
    /// once. For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn pull(
        &self,
        packages: Vec<&str>,
        archs: Vec<&str>,
        pin: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        let (packages, archs) = request_lists(packages, archs)?;
        authorize(conn, &hdr, "Pull").await?;
        self.remote_configured()?;
        self.start_tasks(&packages, &archs, Fetch::Pull, pin).await
    }

    /// Push the stored builds of `packages` (empty: all) for `archs`
    /// (empty: every arch stored) to the registry. Returns the job at once.
    /// For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn push(
        &self,
        packages: Vec<&str>,
        archs: Vec<&str>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        let (packages, archs) = request_lists(packages, archs)?;
        authorize(conn, &hdr, "Push").await?;
        self.remote_configured()?;
        let c = self.cache.clone();
        let entries = blocking(&ROOT_WORK, move || c.stored(&packages, &archs))
            .await?
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let c = self.cache.clone();
        crate::cache::start_work(self.cache.clone(), entries.len(), move |state| async move {
            c.run_push(entries, state).await;
        })
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Import prebuilt files as package `name`: each `(file name, open
    /// file)` is read from the descriptor the caller passes (so gpuarchd
    /// reads only what the caller could open), stored by content, and
    /// served by the code the inspector finds in it. With `ldconfig`, one
    /// file serves all of a container's GPUs and goes into its loader
    /// cache. Replaces an earlier import of `name`, or, if a file fails,
    /// changes nothing. Returns the job at once. Imports run one at a
    /// time, each streamed to disk; past 8 accepted and unfinished, a call
    /// is answered LimitsExceeded. For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn import(
        &self,
        name: &str,
        files: Vec<(String, zbus::OwnedFd)>,
        ldconfig: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        if files.is_empty() || files.len() > 64 {
            return Err(fdo::Error::InvalidArgs(format!(
                "{} files given; 1 to 64",
                files.len()
            )));
        }
        authorize(conn, &hdr, "Import").await?;
        gpuarch_kernels::import::check_name(name)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        if let Some((dup, _)) = files.iter().find(|(f, _)| !seen.insert(f.clone())) {
            return Err(fdo::Error::InvalidArgs(format!("{dup} given twice")));
        }
        let place = import_place(&self.cache)?;
        let files: Vec<(String, std::fs::File)> = files
            .into_iter()
            .map(|(n, fd)| (n, std::fs::File::from(std::os::fd::OwnedFd::from(fd))))
            .collect();
        let (c, name) = (self.cache.clone(), name.to_owned());
        crate::cache::start_work(self.cache.clone(), files.len(), move |state| async move {
            c.run_import(name, files, ldconfig, state, place).await;
        })
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Import a consumer's own prebuilt kernels from its wheel (FlashInfer's
    /// `flashinfer-cubin`), or from the directory it is installed in (a
    /// site-packages), read from the descriptor the caller passes; `name`
    /// is its file name, for messages. Below a directory nothing is
    /// resolved through a link. Every member is held
    /// to the wheel's RECORD and the library's own checksum lists, and its
    /// size bounded, before anything is kept; the version replaces an
    /// earlier import of it whole, or nothing changes. Then its trees are
    /// laid out for the host's GPUs (the job's log, a line each), which the
    /// hook mounts into containers of the same FlashInfer version. Returns
    /// the job at once; one import at a time, as `Import`. For root and
    /// group gpuarch.
    #[zbus(out_args("job"))]
    async fn import_library(
        &self,
        wheel: zbus::OwnedFd,
        name: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        authorize(conn, &hdr, "ImportLibrary").await?;
        if name.is_empty()
            || name.len() > 255
            || name.contains('/')
            || name.chars().any(char::is_control)
        {
            return Err(fdo::Error::InvalidArgs(format!(
                "{name:?} is not a wheel's file name"
            )));
        }
        let place = import_place(&self.cache)?;
        let file = std::fs::File::from(std::os::fd::OwnedFd::from(wheel));
        match file.metadata() {
            Ok(m) if m.is_file() || m.is_dir() => {}
            _ => {
                return Err(fdo::Error::InvalidArgs(format!(
                    "{name}: neither a wheel nor a directory"
                )));
            }
        }
        let (c, name) = (self.cache.clone(), name.to_owned());
        crate::cache::start_work(self.cache.clone(), 1, move |state| async move {
            c.run_library_import(name, file, state, place).await;
        })
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Pull the wheel of library `dist` `version` (`flashinfer-cubin`,
    /// `0.6.13`) from the registry (`kernels.remote`), where a node that
    /// imported it pushed it, and import it as `ImportLibrary` would: every
    /// check and bound of an import holds, and what the registry says of
    /// the wheel is only checked against it. A version imported already is
    /// not pulled again. Then its trees are laid out. Returns the job at
    /// once; one import at a time. For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn pull_library(
        &self,
        dist: &str,
        version: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        authorize(conn, &hdr, "PullLibrary").await?;
        let kind = gpuarch_core::library::kind(dist).ok_or_else(|| {
            fdo::Error::InvalidArgs(
                gpuarch_kernels::library::LibraryError::Unknown(dist.chars().take(64).collect())
                    .to_string(),
            )
        })?;
        if !gpuarch_core::library::valid_version(version)
            || gpuarch_kernels::remote::library_tag(kind.dist, version).is_none()
        {
            return Err(fdo::Error::InvalidArgs(format!(
                "{:?} is not a version gpuarch can pull",
                version.chars().take(64).collect::<String>()
            )));
        }
        self.remote_configured()?;
        let place = import_place(&self.cache)?;
        let (c, version) = (self.cache.clone(), version.to_owned());
        crate::cache::start_work(self.cache.clone(), 1, move |state| async move {
            c.run_library_pull(kind.dist, version, state, place).await;
        })
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Remove import `name`: containers started from now on no longer get
    /// it; those that mount it keep it. Its files are unpinned, for the
    /// LRU to take. Returns how many files it had. For root and group
    /// gpuarch.
    #[zbus(out_args("files"))]
    async fn remove_import(
        &self,
        name: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<u32> {
        authorize(conn, &hdr, "RemoveImport").await?;
        gpuarch_kernels::import::check_name(name)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let (c, n) = (self.cache.clone(), name.to_owned());
        match blocking(&ROOT_WORK, move || c.remove_import(&n)).await? {
            Ok(Ok(files)) => Ok(u32::try_from(files).unwrap_or(u32::MAX)),
            Ok(Err(known)) => Err(fdo::Error::InvalidArgs(format!(
                "no import named {name} (imports: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))),
            Err(e) => Err(fdo::Error::Failed(format!("removing import {name}: {e}"))),
        }
    }

    /// Evict least recently used builds above LimitBytes (never pinned or
    /// mounted ones); returns the bytes freed. For root and group gpuarch.
    #[zbus(out_args("freed_bytes"))]
    async fn garbage_collect(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<u64> {
        authorize(conn, &hdr, "GarbageCollect").await?;
        let c = self.cache.clone();
        let r = blocking(&ROOT_WORK, move || c.gc())
            .await?
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        Ok(r.freed_bytes)
    }

    /// Check every stored file's sha256; a corrupt build is quarantined and
    /// rebuilt. One record per build: key, package, arch, variant, ok,
    /// problem. For root and group gpuarch (it reads the whole cache).
    #[zbus(out_args("results"))]
    async fn verify(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<Vec<VerifyRecord>> {
        authorize(conn, &hdr, "Verify").await?;
        let c = self.cache.clone();
        let (records, rebuild) = blocking(&ROOT_WORK, move || c.verify())
            .await?
            .map_err(store_error)?;
        if !rebuild.is_empty() {
            crate::cache::start_job(self.cache.clone(), rebuild, Fetch::Build, false)
                .await
                .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        }
        Ok(records)
    }

    /// Bytes the stored builds take (LimitsExceeded as for ListKernels).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn used_bytes(&self, #[zbus(header)] hdr: Option<Header<'_>>) -> fdo::Result<u64> {
        let _admitted = Admission::take(hdr.as_ref(), "UsedBytes")?;
        let c = self.cache.clone();
        blocking(&READ_WORK, move || c.used_bytes())
            .await?
            .map_err(store_error)
    }

    /// The size above which builds are evicted (kernels.max_bytes).
    #[zbus(property(emits_changed_signal = "const"))]
    fn limit_bytes(&self) -> u64 {
        self.cache.builder.store.max_bytes()
    }

    /// The compiler NVRTC packages are built with, `NVRTC 12.9 (PATH)`, or
    /// `none: REASON` when no NVRTC build is possible. A build worker is
    /// asked once (as the first build would), off the dispatcher.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn compiler(&self) -> fdo::Result<String> {
        let b = self.cache.builder.clone();
        blocking(&READ_WORK, move || compiler_line(b.nvrtc_probe())).await
    }
}

/// [`KernelCache::compiler`]'s answer for a load of NVRTC.
pub fn compiler_line(
    loaded: Result<gpuarch_kernels::worker::Probe, gpuarch_kernels::store::BuildError>,
) -> String {
    match loaded {
        Ok(n) => format!("NVRTC {} ({})", n.version, n.library.display()),
        Err(e) => format!("none: {e}"),
    }
}

/// A place among the imports waiting (of either kind), or LimitsExceeded.
fn import_place(cache: &crate::cache::Cache) -> fdo::Result<crate::cache::ImportPlace> {
    cache.import_place().ok_or_else(|| {
        fdo::Error::LimitsExceeded(format!(
            "{} imports are waiting already; import again when one has finished",
            crate::cache::MAX_PENDING_IMPORTS
        ))
    })
}
