//! A raw AMQP 0-9-1 publisher for the tests: it writes the frames itself, so it can
//! publish what no client library lets through (short strings that are not UTF-8, ids of
//! any length, headers of any type) and shows what a hostile or careless producer can put
//! in a queue. It speaks just enough of the protocol: PLAIN login, one channel in confirm
//! mode, `basic.publish` and the broker's confirm.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_END: u8 = 0xCE;

/// A field value of a header table, written as RabbitMQ reads it.
#[derive(Debug, Clone)]
pub enum Field {
    /// `S`: a long string, any bytes.
    Bytes(Vec<u8>),
    /// `l`: a signed 64-bit integer.
    I64(i64),
    /// `t`: a boolean.
    Bool(bool),
    /// `F`: a nested table.
    Table(Vec<(Vec<u8>, Field)>),
    /// A value already encoded: its type tag, then `bytes` as they go on the wire.
    Encoded(u8, Vec<u8>),
}

/// A table holding a table holding ... `levels` tables (`{"k": {"k": ... {}}}`), built
/// without recursion: a producer can nest as deep as RabbitMQ's frame size allows (about
/// 18000 levels).
pub fn nested_tables(levels: usize) -> Field {
    // Level n takes 7 n - 3 bytes: its length, then the entry "k" => F and level n - 1.
    let mut bytes = Vec::with_capacity(7 * levels);
    for n in (2..=levels).rev() {
        let len = u32::try_from(7 * (n - 1)).unwrap_or(u32::MAX);
        bytes.extend(len.to_be_bytes());
        bytes.extend([1, b'k', b'F']);
    }
    bytes.extend([0, 0, 0, 0]);
    Field::Encoded(b'F', bytes)
}

/// The basic properties of a raw publish; every text is raw bytes. Unset ones are left out.
#[derive(Debug, Clone, Default)]
pub struct RawProperties {
    /// `content_type`.
    pub content_type: Option<Vec<u8>>,
    /// `headers`: names and values as given, in this order.
    pub headers: Option<Vec<(Vec<u8>, Field)>>,
    /// `delivery_mode`.
    pub delivery_mode: Option<u8>,
    /// `correlation_id`.
    pub correlation_id: Option<Vec<u8>>,
    /// `reply_to`.
    pub reply_to: Option<Vec<u8>>,
    /// `message_id`.
    pub message_id: Option<Vec<u8>>,
    /// `type`.
    pub kind: Option<Vec<u8>>,
}

/// How the broker answered a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    /// `basic.ack`: the broker has the message.
    Ack,
    /// `basic.nack`.
    Nack,
    /// The broker closed the channel or connection: reply code and text.
    Closed(u16, String),
}

/// One connection with one confirm-mode channel.
pub struct RawPublisher {
    stream: TcpStream,
    buf: Vec<u8>,
    frame_max: usize,
}

fn short(out: &mut Vec<u8>, s: &[u8]) -> io::Result<()> {
    let len = u8::try_from(s.len()).map_err(|_| invalid("a short string over 255 bytes"))?;
    out.push(len);
    out.extend_from_slice(s);
    Ok(())
}

fn long(out: &mut Vec<u8>, s: &[u8]) -> io::Result<()> {
    let len = u32::try_from(s.len()).map_err(|_| invalid("a long string over 4 GiB"))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s);
    Ok(())
}

fn table(out: &mut Vec<u8>, entries: &[(Vec<u8>, Field)]) -> io::Result<()> {
    let mut t = Vec::new();
    for (name, value) in entries {
        short(&mut t, name)?;
        match value {
            Field::Bytes(b) => {
                t.push(b'S');
                long(&mut t, b)?;
            }
            Field::I64(n) => {
                t.push(b'l');
                t.extend_from_slice(&n.to_be_bytes());
            }
            Field::Bool(b) => {
                t.push(b't');
                t.push(u8::from(*b));
            }
            Field::Table(inner) => {
                t.push(b'F');
                table(&mut t, inner)?;
            }
            Field::Encoded(tag, bytes) => {
                t.push(*tag);
                t.extend_from_slice(bytes);
            }
        }
    }
    long(out, &t)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_owned())
}

fn protocol(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// `%2f` and friends in a URL part.
fn percent_decode(s: &str) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| invalid("a bad %-escape in the URL"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| invalid("a bad %-escape in the URL"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

impl RawPublisher {
    /// Connects to `amqp://user:password@host:port/vhost` and opens channel 1 in confirm
    /// mode.
    ///
    /// # Errors
    /// When the URL is not of that form, the broker cannot be reached or refuses.
    pub async fn connect(url: &str) -> io::Result<Self> {
        let rest = url
            .strip_prefix("amqp://")
            .ok_or_else(|| invalid("not an amqp:// URL"))?;
        let (credentials, rest) = rest.split_once('@').ok_or_else(|| invalid("no user in the URL"))?;
        let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
        let (address, vhost) = rest.split_once('/').unwrap_or((rest, ""));
        let vhost = if vhost.is_empty() {
            b"/".to_vec()
        } else {
            percent_decode(vhost)?
        };
        let stream = TcpStream::connect(address).await?;
        let mut c = Self {
            stream,
            buf: Vec::new(),
            frame_max: 4096,
        };
        c.stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
        c.expect_method(0, (10, 10)).await?; // connection.start
        let mut response = vec![0];
        response.extend(percent_decode(user)?);
        response.push(0);
        response.extend(percent_decode(password)?);
        let mut args = Vec::new();
        args.extend_from_slice(&0_u32.to_be_bytes()); // client properties: an empty table
        short(&mut args, b"PLAIN")?;
        long(&mut args, &response)?;
        short(&mut args, b"en_US")?;
        c.method(0, (10, 11), &args).await?; // start-ok
        let tune = c.expect_method(0, (10, 30)).await?;
        let channel_max = tune.get(0..2).ok_or_else(|| protocol("a short tune".into()))?.to_vec();
        let frame_max = tune.get(2..6).ok_or_else(|| protocol("a short tune".into()))?;
        let frame_max = u32::from_be_bytes([frame_max[0], frame_max[1], frame_max[2], frame_max[3]]);
        c.frame_max = usize::try_from(frame_max).unwrap_or(4096).max(4096);
        let mut args = channel_max;
        args.extend_from_slice(&frame_max.to_be_bytes());
        args.extend_from_slice(&0_u16.to_be_bytes()); // no heartbeats
        c.method(0, (10, 31), &args).await?; // tune-ok
        let mut args = Vec::new();
        short(&mut args, &vhost)?;
        short(&mut args, b"")?;
        args.push(0);
        c.method(0, (10, 40), &args).await?; // connection.open
        c.expect_method(0, (10, 41)).await?;
        c.method(1, (20, 10), &[0]).await?; // channel.open
        c.expect_method(1, (20, 11)).await?;
        c.method(1, (85, 10), &[0]).await?; // confirm.select
        c.expect_method(1, (85, 11)).await?;
        Ok(c)
    }

    async fn frame(&mut self, kind: u8, channel: u16, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len()).map_err(|_| invalid("a frame over 4 GiB"))?;
        let mut f = Vec::with_capacity(payload.len() + 8);
        f.push(kind);
        f.extend_from_slice(&channel.to_be_bytes());
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(payload);
        f.push(FRAME_END);
        self.stream.write_all(&f).await
    }

    async fn method(&mut self, channel: u16, (class, method): (u16, u16), args: &[u8]) -> io::Result<()> {
        let mut p = Vec::with_capacity(args.len() + 4);
        p.extend_from_slice(&class.to_be_bytes());
        p.extend_from_slice(&method.to_be_bytes());
        p.extend_from_slice(args);
        self.frame(FRAME_METHOD, channel, &p).await
    }

    /// The next frame: type, channel, payload.
    async fn read_frame(&mut self) -> io::Result<(u8, u16, Vec<u8>)> {
        loop {
            if self.buf.len() >= 7 {
                let size = u32::from_be_bytes([self.buf[3], self.buf[4], self.buf[5], self.buf[6]]);
                let size = usize::try_from(size).map_err(|_| protocol("a huge frame".into()))?;
                if self.buf.len() >= size + 8 {
                    let kind = self.buf[0];
                    let channel = u16::from_be_bytes([self.buf[1], self.buf[2]]);
                    let payload = self.buf[7..7 + size].to_vec();
                    self.buf.drain(..size + 8);
                    return Ok((kind, channel, payload));
                }
            }
            let mut chunk = [0_u8; 8192];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the broker closed the socket",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next method frame (other frames are skipped): its class and method ids and
    /// arguments.
    async fn read_method(&mut self) -> io::Result<((u16, u16), Vec<u8>)> {
        loop {
            let (kind, _, payload) = self.read_frame().await?;
            if kind == FRAME_METHOD && payload.len() >= 4 {
                let class = u16::from_be_bytes([payload[0], payload[1]]);
                let method = u16::from_be_bytes([payload[2], payload[3]]);
                return Ok(((class, method), payload[4..].to_vec()));
            }
        }
    }

    async fn expect_method(&mut self, channel: u16, want: (u16, u16)) -> io::Result<Vec<u8>> {
        let (got, args) = self.read_method().await?;
        if got == want {
            return Ok(args);
        }
        Err(protocol(format!(
            "expected method {want:?} on channel {channel}, the broker sent {got:?}: {}",
            String::from_utf8_lossy(&args)
        )))
    }

    /// Publishes `body` with `properties` to `exchange` with `routing_key` (mandatory) and
    /// waits for the broker's answer. A publish the broker returned is reported by the
    /// confirm that follows (RabbitMQ acks a returned message).
    ///
    /// # Errors
    /// When the socket fails.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &[u8],
        properties: &RawProperties,
        body: &[u8],
    ) -> io::Result<Confirm> {
        let mut args = vec![0, 0];
        short(&mut args, exchange.as_bytes())?;
        short(&mut args, routing_key)?;
        args.push(1); // mandatory
        self.method(1, (60, 40), &args).await?;
        let mut flags: u16 = 0;
        let mut props = Vec::new();
        let p = properties;
        if let Some(v) = &p.content_type {
            flags |= 1 << 15;
            short(&mut props, v)?;
        }
        if let Some(h) = &p.headers {
            flags |= 1 << 13;
            table(&mut props, h)?;
        }
        if let Some(m) = p.delivery_mode {
            flags |= 1 << 12;
            props.push(m);
        }
        if let Some(v) = &p.correlation_id {
            flags |= 1 << 10;
            short(&mut props, v)?;
        }
        if let Some(v) = &p.reply_to {
            flags |= 1 << 9;
            short(&mut props, v)?;
        }
        if let Some(v) = &p.message_id {
            flags |= 1 << 7;
            short(&mut props, v)?;
        }
        if let Some(v) = &p.kind {
            flags |= 1 << 5;
            short(&mut props, v)?;
        }
        let mut header = Vec::new();
        header.extend_from_slice(&60_u16.to_be_bytes());
        header.extend_from_slice(&0_u16.to_be_bytes());
        header.extend_from_slice(&(body.len() as u64).to_be_bytes());
        header.extend_from_slice(&flags.to_be_bytes());
        header.extend(props);
        self.frame(FRAME_HEADER, 1, &header).await?;
        for chunk in body.chunks(self.frame_max - 8) {
            self.frame(FRAME_BODY, 1, chunk).await?;
        }
        loop {
            let (method, args) = match self.read_method().await {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Ok(Confirm::Closed(0, e.to_string()));
                }
                Err(e) => return Err(e),
            };
            match method {
                (60, 80) => return Ok(Confirm::Ack),
                (60, 120) => return Ok(Confirm::Nack),
                (10, 50) | (20, 40) => {
                    // reply-code, reply-text (a short string), class-id, method-id
                    let code = args.get(0..2).map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
                    let len = args.get(2).map_or(0, |l| usize::from(*l));
                    let text = args.get(3..3 + len).map(String::from_utf8_lossy).unwrap_or_default();
                    return Ok(Confirm::Closed(code, text.into_owned()));
                }
                _ => {} // basic.return and its content: the confirm follows
            }
        }
    }
}
