//! Text gpuarch writes where one line is one record (the hook's and the
//! shim's log files, gpuarchd's lines on stderr): whatever a message
//! carries from a container, an image or a bus caller, it stays one
//! bounded line.

/// The most bytes of one record; the rest is cut and counted. Far above
/// any note gpuarch writes, far below what a config can carry.
pub const MAX_RECORD_BYTES: usize = 4096;

/// `msg` as one bounded line: control characters (a newline from an image
/// annotation, an escape sequence in an env value) written as `\n`,
/// `\u{1b}`, and so on, so no record can forge another or drive a
/// terminal; past [`MAX_RECORD_BYTES`], cut with the count of what was cut.
pub fn clean(msg: &str) -> std::borrow::Cow<'_, str> {
    if msg.len() <= MAX_RECORD_BYTES && !msg.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(msg);
    }
    let mut out = String::with_capacity(msg.len().min(MAX_RECORD_BYTES) + 48);
    let mut taken = 0;
    for c in msg.chars() {
        let piece: std::borrow::Cow<'_, str> = match c {
            '\n' => "\\n".into(),
            '\r' => "\\r".into(),
            '\t' => "\\t".into(),
            c if c.is_control() => format!("\\u{{{:x}}}", c as u32).into(),
            c => c.encode_utf8(&mut [0; 4]).to_owned().into(),
        };
        if out.len() + piece.len() > MAX_RECORD_BYTES {
            break;
        }
        out.push_str(&piece);
        taken += c.len_utf8();
    }
    if taken < msg.len() {
        out.push_str(&format!(" [{} more bytes cut]", msg.len() - taken));
    }
    std::borrow::Cow::Owned(out)
}
/// The first line of `s` that is not blank (a tool's error often starts
/// with an empty one), or `s` when every line is.
pub fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s)
}

/// An error and its causes in one line, each cause after `": "`, as
/// gpuarch's programs print them.
///
/// gpuarch's own errors print their cause or return it as their source,
/// never both, so their chain joins as it is. Some libraries' errors do
/// both (zbus's `I/O error: {e}` returns `e` too): a cause whose text the
/// error before it already ends with is not written again.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut last = line.clone();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !last.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        last = text;
        next = cause.source();
    }
    line
}

#[cfg(test)]
mod tests;
