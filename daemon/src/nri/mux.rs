//! NRI's connection multiplexer. A plugin's one connection to the runtime
//! carries two byte streams: the plugin's service (the runtime calls it)
//! and the runtime's (the plugin calls it). Each frame is the stream's id
//! and the payload's length, big-endian `u32`s, then the payload; the
//! streams are ttrpc connections, split across frames however the sender
//! chose.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// The stream on which the runtime calls the plugin.
pub const PLUGIN_SERVICE: u32 = 1;
/// The stream on which the plugin calls the runtime.
pub const RUNTIME_SERVICE: u32 = 2;
/// The largest frame read: NRI's own bound, one ttrpc message (a 10-byte
/// header and at most 4 MiB). A larger one ends the connection.
pub const MAX_FRAME: u32 = 10 + (4 << 20);
/// How much of one stream may wait unread before the trunk's reader waits.
const PIPE: usize = 256 << 10;

/// The rest of a frame, once its header is read, must come within this:
/// a peer that stops mid-frame is not waited for. (Between frames a
/// runtime may be silent for hours.)
pub const FRAME_WITHIN: Duration = Duration::from_secs(10);

/// One connection, split.
#[derive(Debug)]
pub struct Mux {
    /// What the plugin's ttrpc server serves on.
    pub plugin: DuplexStream,
    /// What the plugin's ttrpc client calls on.
    pub runtime: DuplexStream,
    /// Ends when the connection does, with why.
    pub done: JoinHandle<io::Error>,
    /// The connection's tasks, ended when this is dropped: a session that
    /// fails (a peer that never registers) leaves nothing behind.
    pub tasks: Tasks,
}

/// Aborts the connection's tasks (and so closes it) when dropped.
#[derive(Debug)]
pub struct Tasks(Vec<tokio::task::AbortHandle>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Split `trunk` into its two streams. Frames for another stream id are
/// dropped, as NRI's own multiplexer drops them.
pub fn split<S>(trunk: S) -> Mux
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (from_trunk, to_trunk) = tokio::io::split(trunk);
    let to_trunk = Arc::new(Mutex::new(to_trunk));
    let (plugin, plugin_far) = tokio::io::duplex(PIPE);
    let (runtime, runtime_far) = tokio::io::duplex(PIPE);
    let (plugin_out, plugin_in) = tokio::io::split(plugin_far);
    let (runtime_out, runtime_in) = tokio::io::split(runtime_far);
    let up = [
        tokio::spawn(pump(PLUGIN_SERVICE, plugin_out, to_trunk.clone())),
        tokio::spawn(pump(RUNTIME_SERVICE, runtime_out, to_trunk)),
    ];
    let mut tasks: Vec<_> = up.iter().map(JoinHandle::abort_handle).collect();
    let done = tokio::spawn(async move {
        let why = demux(from_trunk, plugin_in, runtime_in).await;
        for p in up {
            p.abort();
        }
        why
    });
    tasks.push(done.abort_handle());
    Mux {
        plugin,
        runtime,
        done,
        tasks: Tasks(tasks),
    }
}

/// Frame what one stream writes onto the trunk.
async fn pump<R, W>(id: u32, mut from: R, to: Arc<Mutex<W>>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut frame = vec![0u8; 8 + (64 << 10)];
    loop {
        let n = from.read(&mut frame[8..]).await?;
        if n == 0 {
            return Ok(());
        }
        frame[..4].copy_from_slice(&id.to_be_bytes());
        frame[4..8].copy_from_slice(&(n as u32).to_be_bytes());
        to.lock().await.write_all(&frame[..8 + n]).await?;
    }
}

/// Hand each frame's payload to its stream until the trunk ends.
async fn demux<R: AsyncRead + Unpin>(
    mut from: R,
    mut plugin: WriteHalf<DuplexStream>,
    mut runtime: WriteHalf<DuplexStream>,
) -> io::Error {
    let mut header = [0u8; 8];
    // A frame is passed on as it arrives, a piece at a time: what a peer
    // claims is never allocated.
    let mut piece = vec![0u8; 64 << 10];
    loop {
        if let Err(e) = from.read_exact(&mut header).await {
            return e;
        }
        let (id, len) = frame_header(&header);
        if len > MAX_FRAME {
            return io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {len} bytes; NRI's limit is {MAX_FRAME}"),
            );
        }
        let mut to = match id {
            PLUGIN_SERVICE => Some(&mut plugin),
            RUNTIME_SERVICE => Some(&mut runtime),
            _ => None,
        };
        let pass = async {
            let mut left = len as usize;
            while left > 0 {
                let want = left.min(piece.len());
                let n = from.read(&mut piece[..want]).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if let Some(to) = to.as_mut() {
                    to.write_all(&piece[..n]).await?;
                }
                left -= n;
            }
            Ok::<(), io::Error>(())
        };
        match tokio::time::timeout(FRAME_WITHIN, pass).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return e,
            Err(_) => {
                return io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "a frame's {len} bytes did not come within {} s",
                        FRAME_WITHIN.as_secs()
                    ),
                );
            }
        }
    }
}

fn frame_header(h: &[u8; 8]) -> (u32, u32) {
    let [a, b, c, d, e, f, g, k] = *h;
    (
        u32::from_be_bytes([a, b, c, d]),
        u32::from_be_bytes([e, f, g, k]),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn frame(id: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = id.to_be_bytes().to_vec();
        f.extend((payload.len() as u32).to_be_bytes());
        f.extend(payload);
        f
    }

    #[tokio::test]
    async fn frames_reach_their_stream_and_writes_come_back_framed() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut m = split(ours);
        // One stream's bytes split over two frames, another's between
        // them, and a frame for an id nobody opened.
        let mut wire = frame(RUNTIME_SERVICE, b"hel");
        wire.extend(frame(PLUGIN_SERVICE, b"call"));
        wire.extend(frame(7, b"dropped"));
        wire.extend(frame(RUNTIME_SERVICE, b"lo"));
        theirs.write_all(&wire).await.unwrap();
        let mut got = [0u8; 5];
        m.runtime.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        let mut got = [0u8; 4];
        m.plugin.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"call");

        m.plugin.write_all(b"answer").await.unwrap();
        let mut back = [0u8; 14];
        theirs.read_exact(&mut back).await.unwrap();
        assert_eq!(back.to_vec(), frame(PLUGIN_SERVICE, b"answer"));

        drop(theirs);
        let why = m.done.await.unwrap();
        assert_eq!(why.kind(), io::ErrorKind::UnexpectedEof);
        // Both streams see the end.
        let mut rest = Vec::new();
        assert_eq!(m.runtime.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_frame_over_nris_limit_ends_the_connection_unread() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 10);
        let m = split(ours);
        let mut h = PLUGIN_SERVICE.to_be_bytes().to_vec();
        h.extend(u32::MAX.to_be_bytes());
        theirs.write_all(&h).await.unwrap();
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), m.done)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(why.kind(), io::ErrorKind::InvalidData);
        assert!(why.to_string().contains("limit"), "{why}");
    }
}
