//! Who may call a privileged method: root and members of
//! [`super::ADMIN_GROUP`], as the bus reports the caller's credentials
//! (cached for the life of its unique name, bounded).

use zbus::message::Header;
use zbus::{Connection, fdo};

use super::ADMIN_GROUP;

/// The uid and groups of a bus connection, as the bus said them.
type Creds = (u32, Option<Vec<u32>>);

/// Credentials by unique connection name. The bus never gives a unique
/// name twice and takes a connection's credentials once, when it
/// connects, so an answer holds for the name's whole life; a privileged
/// caller's second call costs no bus round trip, however busy the bus.
/// Bounded: past [`CREDS_KEPT`] names the oldest half is forgotten.
static CREDS: std::sync::Mutex<std::collections::BTreeMap<String, (u64, Creds)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
const CREDS_KEPT: usize = 4096;

fn creds_cached(sender: &str) -> Option<Creds> {
    CREDS.lock().ok()?.get(sender).map(|(_, c)| c.clone())
}

fn creds_keep(sender: &str, creds: Creds) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Ok(mut m) = CREDS.lock() else { return };
    if m.len() >= CREDS_KEPT {
        let mut ages: Vec<u64> = m.values().map(|(n, _)| *n).collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        m.retain(|_, (n, _)| *n > cut);
    }
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    m.insert(sender.to_owned(), (n, creds));
}

/// A connection of gpuarchd's own to the bus for credential lookups
/// alone. On the serving connection the lookup's request waits behind
/// gpuarchd's replies to every call in flight: under a flood of 250
/// connections root's first call waited 10 s for it, while a Ping took
/// under a millisecond. On a connection of its own it is one round trip.
static SIDE: tokio::sync::Mutex<Option<Connection>> = tokio::sync::Mutex::const_new(None);

/// Make the side connection now, on a quiet bus (gpuarchd's start, or its
/// return after the bus restarted), rather than under the flood that a
/// first privileged call may come in.
pub(crate) async fn open_side_connection() {
    *SIDE.lock().await = side_connection().await;
}

/// A new side connection to the system bus, if one can be made.
async fn side_connection() -> Option<Connection> {
    zbus::connection::Builder::system()
        .method_timeout(std::time::Duration::from_secs(25))
        .build()
        .await
        .ok()
}

/// GetConnectionCredentials of `sender`, asked on the side connection (made
/// on the serving connection's bus when first needed, and again once if it
/// broke), or on `conn` when none can be made.
async fn lookup_creds(conn: &Connection, sender: &str) -> fdo::Result<fdo::ConnectionCredentials> {
    let ask = |c: Connection| async move {
        fdo::DBusProxy::builder(&c)
            // A plain proxy: no property cache, so no match rule and no
            // GetAll round trip before the one call that matters.
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?
            .get_connection_credentials(zbus::names::BusName::try_from(sender)?)
            .await
    };
    let mut side = SIDE.lock().await;
    for _ in 0..2 {
        if side.is_none() {
            *side = side_connection().await;
        }
        let Some(c) = side.clone() else { break };
        match ask(c).await {
            Ok(creds) => return Ok(creds),
            Err(zbus::fdo::Error::ZBus(_) | zbus::fdo::Error::Disconnected(_)) => *side = None,
            Err(e) => return Err(e),
        }
    }
    drop(side);
    ask(conn.clone()).await
}

/// Why a privileged call is refused, if it is.
pub(crate) async fn authorize(
    conn: &Connection,
    hdr: &Header<'_>,
    method: &str,
) -> fdo::Result<()> {
    let sender = hdr
        .sender()
        .ok_or_else(|| fdo::Error::AccessDenied(format!("{method}: the call has no sender")))?;
    let (uid, bus_groups) = match creds_cached(sender.as_str()) {
        Some(c) => c,
        None => {
            let creds = lookup_creds(conn, sender.as_str()).await?;
            let uid = creds.unix_user_id().ok_or_else(|| {
                fdo::Error::AccessDenied(format!("{method}: the bus did not say who the caller is"))
            })?;
            let c = (uid, creds.unix_group_ids().cloned());
            creds_keep(sender.as_str(), c.clone());
            c
        }
    };
    if uid == 0 {
        return Ok(());
    }
    let admin = nix::unistd::Group::from_name(ADMIN_GROUP)
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw());
    let groups: Vec<u32> = match bus_groups {
        Some(g) => g,
        // Buses without UnixGroupIDs: the groups the user database gives.
        None => groups_of(uid),
    };
    if admin.is_some_and(|g| groups.contains(&g)) {
        return Ok(());
    }
    Err(fdo::Error::AccessDenied(format!(
        "{method} is for root and members of group {ADMIN_GROUP}; the caller (uid {uid}) is neither"
    )))
}

fn groups_of(uid: u32) -> Vec<u32> {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return Vec::new();
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return Vec::new();
    };
    nix::unistd::getgrouplist(&name, user.gid)
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default()
}
