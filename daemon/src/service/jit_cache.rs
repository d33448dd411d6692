//! `io.gpuarch1.JitCache`: the per-architecture JIT caches (config
//! `jit_cache`).

use std::sync::Arc;

use gpuarch_wire::dbus::JitCacheRecord;
use zbus::message::Header;
use zbus::{Connection, fdo, interface};

use super::admission::{Admission, READ_WORK, ROOT_WORK, blocking};
use super::authorize;
use crate::state::Shared;

/// `io.gpuarch1.JitCache`.
#[derive(Debug)]
pub struct JitCache {
    pub shared: Arc<Shared>,
}

/// The per-architecture JIT caches (config `jit_cache`).
#[interface(name = "io.gpuarch1.JitCache")]
impl JitCache {
    /// Every cache: scope, kind, uid, image, namespace, targets, bytes,
    /// in_use, last_used, path (LimitsExceeded as for ListKernels).
    #[zbus(out_args("caches"))]
    async fn list_caches(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> fdo::Result<Vec<JitCacheRecord>> {
        let _admitted = Admission::take(Some(&hdr), "ListCaches")?;
        let cfg = self.shared.config().jit_cache.clone();
        blocking(&READ_WORK, move || {
            crate::jit::list(&cfg, &crate::jit::mounted(&cfg.dir))
        })
        .await?
        .map_err(|e| fdo::Error::IOError(format!("reading the JIT caches: {e}")))
    }

    /// Remove the least recently started caches above LimitBytes (never
    /// one mounted now or handed out in the last 10 minutes); returns the
    /// bytes freed. For root and group gpuarch.
    #[zbus(out_args("freed_bytes"))]
    async fn garbage_collect(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<u64> {
        authorize(conn, &hdr, "GarbageCollect").await?;
        let cfg = self.shared.config().jit_cache.clone();
        let r = blocking(&ROOT_WORK, move || {
            crate::jit::gc(&cfg, &crate::jit::mounted(&cfg.dir))
        })
        .await?
        .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        crate::jit::log_report(&r);
        if let Some(f) = r.failed.first() {
            return Err(fdo::Error::Failed(format!(
                "freed {} bytes; {} cache(s) set aside but not removed: {f}",
                r.freed_bytes,
                r.failed.len()
            )));
        }
        Ok(r.freed_bytes)
    }

    /// Bytes the caches take (LimitsExceeded as for ListKernels).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn used_bytes(&self, #[zbus(header)] hdr: Option<Header<'_>>) -> fdo::Result<u64> {
        let _admitted = Admission::take(hdr.as_ref(), "UsedBytes")?;
        let cfg = self.shared.config().jit_cache.clone();
        let caches = blocking(&READ_WORK, move || {
            crate::jit::list(&cfg, &Default::default())
        })
        .await?
        .map_err(|e| fdo::Error::IOError(format!("reading the JIT caches: {e}")))?;
        Ok(caches.iter().map(|c| c.bytes).sum())
    }

    /// The size above which caches are removed (jit_cache.max_bytes).
    #[zbus(property(emits_changed_signal = "false"))]
    fn limit_bytes(&self) -> u64 {
        self.shared.config().jit_cache.max_bytes
    }
}
