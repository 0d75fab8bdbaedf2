//! The fake server's transport: WhatsApp's frames on the WebSocket, the
//! client's hello, and the Noise XX / IK handshake as the responder.

use super::phone::{key_pair, pub32};
use futures_util::{SinkExt, StreamExt};
use tokio_websockets::Message;
use whatsapp_rust::buffa::{self, Message as _};
use whatsapp_rust::wacore::handshake::NoiseHandshake;
use whatsapp_rust::wacore::libsignal::protocol::KeyPair;
use whatsapp_rust::wacore::noise::NoiseCipher;
use whatsapp_rust::wacore_binary::consts::{NOISE_PATTERN_IK, NOISE_PATTERN_XX, WA_CONN_HEADER};
use whatsapp_rust::waproto::whatsapp as wa;

pub(super) type Ws = tokio_websockets::WebSocketStream<tokio::net::TcpStream>;
pub(super) type WsRead = futures_util::stream::SplitStream<Ws>;
pub(super) type WsWrite = futures_util::stream::SplitSink<Ws, Message>;

/// What the client said about itself in its handshake payload.
#[derive(Debug, Clone)]
pub struct ClientHello {
    /// `Some(user)` for a login; `None` for a new device asking to pair.
    pub username: Option<u64>,
    pub device: Option<u32>,
    /// Present when the client registers as a new device.
    pub registration: Option<Registration>,
    pub passive: bool,
    pub version: Option<(u32, u32, u32)>,
}

/// A new device's keys, from its registration payload.
#[derive(Debug, Clone)]
pub struct Registration {
    pub registration_id: Vec<u8>,
    pub identity_key: Vec<u8>,
}

/// Reads WhatsApp frames (3-byte big-endian length, then the frame) from
/// the WebSocket's binary messages.
pub(super) struct Frames {
    pub(super) buf: Vec<u8>,
    pub(super) header_seen: bool,
}

impl Frames {
    pub(super) async fn next(&mut self, ws: &mut WsRead) -> Result<Vec<u8>, String> {
        loop {
            if !self.header_seen && self.buf.len() >= WA_CONN_HEADER.len() {
                let head = &self.buf[..WA_CONN_HEADER.len()];
                if head[..3] == WA_CONN_HEADER[..3] && head[3] != WA_CONN_HEADER[3] {
                    // The last byte names the binary dictionary: whatsapp-rust
                    // and Baileys 7 use 3, Baileys 6 still 2 (other tokens).
                    return Err(format!(
                        "the client speaks binary dictionary version {}; this server speaks {} only",
                        head[3], WA_CONN_HEADER[3]
                    ));
                }
                if head != WA_CONN_HEADER {
                    return Err("the connection does not start with WhatsApp's header".into());
                }
                self.buf.drain(..WA_CONN_HEADER.len());
                self.header_seen = true;
            }
            if self.header_seen && self.buf.len() >= 3 {
                let len = (usize::from(self.buf[0]) << 16)
                    | (usize::from(self.buf[1]) << 8)
                    | usize::from(self.buf[2]);
                if self.buf.len() >= 3 + len {
                    let frame = self.buf[3..3 + len].to_vec();
                    self.buf.drain(..3 + len);
                    return Ok(frame);
                }
            }
            match ws.next().await {
                Some(Ok(m)) if m.is_binary() => {
                    let p: whatsapp_rust::bytes::Bytes = m.into_payload().into();
                    self.buf.extend_from_slice(&p);
                }
                Some(Ok(m)) if m.is_close() => return Err("closed by the client".into()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("read: {e}")),
                None => return Err("the client went away".into()),
            }
        }
    }
}

pub(super) fn frame(payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8];
    out.extend_from_slice(payload);
    out
}

pub(super) fn hello_of(payload: &[u8]) -> Result<ClientHello, String> {
    let p = wa::ClientPayload::decode_from_slice(payload).map_err(|e| format!("payload: {e}"))?;
    let registration = p.device_pairing_data.as_option().map(|d| Registration {
        registration_id: d.e_regid.clone().unwrap_or_default(),
        identity_key: d.e_ident.clone().unwrap_or_default(),
    });
    let version = p
        .user_agent
        .as_option()
        .and_then(|ua| ua.app_version.as_option())
        .map(|v| {
            (
                v.primary.unwrap_or(0),
                v.secondary.unwrap_or(0),
                v.tertiary.unwrap_or(0),
            )
        });
    Ok(ClientHello {
        username: p.username,
        device: p.device,
        registration,
        passive: p.passive.unwrap_or(false),
        version,
    })
}

/// The server side of the Noise handshake; answers the transport ciphers
/// (server's read, server's write) and what the client said.
pub(super) async fn handshake(
    noise_static: &KeyPair,
    cert_chain: &[u8],
    ws: &mut WsWrite,
    rd: &mut WsRead,
    frames: &mut Frames,
) -> Result<(NoiseCipher, NoiseCipher, bool, [u8; 32], ClientHello), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let first = frames.next(rd).await?;
    let hello = wa::HandshakeMessage::decode_from_slice(&first).map_err(|x| e(&x))?;
    let ch = hello
        .client_hello
        .into_option()
        .ok_or("the first message is not a ClientHello")?;
    let client_eph: [u8; 32] = ch
        .ephemeral
        .clone()
        .ok_or("ClientHello without an ephemeral key")?
        .try_into()
        .map_err(|_| "ephemeral key is not 32 bytes")?;
    let server_eph = key_pair();
    let server_static_priv = noise_static.private_key.serialize().to_vec();
    let send_hello = |m: wa::HandshakeMessage| Message::binary(frame(&m.encode_to_vec()));
    if let (Some(enc_static), Some(enc_payload)) = (ch.r#static.clone(), ch.payload.clone()) {
        // Noise IK: the client already knows our static key.
        let mut noise =
            NoiseHandshake::new(NOISE_PATTERN_IK, &WA_CONN_HEADER).map_err(|x| e(&x))?;
        noise.authenticate(&pub32(noise_static));
        noise.authenticate(&client_eph);
        noise
            .mix_shared_secret(&server_static_priv, &client_eph)
            .map_err(|x| e(&x))?;
        let client_static: [u8; 32] = noise
            .decrypt(&enc_static)
            .map_err(|x| e(&x))?
            .try_into()
            .map_err(|_| "client static is not 32 bytes")?;
        noise
            .mix_shared_secret(&server_static_priv, &client_static)
            .map_err(|x| e(&x))?;
        let payload = noise.decrypt(&enc_payload).map_err(|x| e(&x))?;
        noise.authenticate(&pub32(&server_eph));
        noise
            .mix_shared_secret(server_eph.private_key.serialize(), &client_eph)
            .map_err(|x| e(&x))?;
        noise
            .mix_shared_secret(server_eph.private_key.serialize(), &client_static)
            .map_err(|x| e(&x))?;
        let enc_cert = noise.encrypt(cert_chain).map_err(|x| e(&x))?;
        ws.send(send_hello(wa::HandshakeMessage {
            server_hello: buffa::MessageField::some(wa::handshake_message::ServerHello {
                ephemeral: Some(pub32(&server_eph).to_vec()),
                r#static: None,
                payload: Some(enc_cert),
                ..Default::default()
            }),
            ..Default::default()
        }))
        .await
        .map_err(|x| e(&x))?;
        let (c2s, s2c) = noise.finish().map_err(|x| e(&x))?;
        return Ok((c2s, s2c, true, client_static, hello_of(&payload)?));
    }
    // Noise XX.
    let mut noise = NoiseHandshake::new(NOISE_PATTERN_XX, &WA_CONN_HEADER).map_err(|x| e(&x))?;
    noise.authenticate(&client_eph);
    noise.authenticate(&pub32(&server_eph));
    noise
        .mix_shared_secret(server_eph.private_key.serialize(), &client_eph)
        .map_err(|x| e(&x))?;
    let enc_static = noise.encrypt(&pub32(noise_static)).map_err(|x| e(&x))?;
    noise
        .mix_shared_secret(&server_static_priv, &client_eph)
        .map_err(|x| e(&x))?;
    let enc_cert = noise.encrypt(cert_chain).map_err(|x| e(&x))?;
    ws.send(send_hello(wa::HandshakeMessage {
        server_hello: buffa::MessageField::some(wa::handshake_message::ServerHello {
            ephemeral: Some(pub32(&server_eph).to_vec()),
            r#static: Some(enc_static),
            payload: Some(enc_cert),
            ..Default::default()
        }),
        ..Default::default()
    }))
    .await
    .map_err(|x| e(&x))?;
    let finish = frames.next(rd).await?;
    let finish = wa::HandshakeMessage::decode_from_slice(&finish).map_err(|x| e(&x))?;
    let cf = finish
        .client_finish
        .into_option()
        .ok_or("the second message is not a ClientFinish")?;
    let client_static: [u8; 32] = noise
        .decrypt(cf.r#static.as_deref().unwrap_or_default())
        .map_err(|x| e(&x))?
        .try_into()
        .map_err(|_| "client static is not 32 bytes")?;
    noise
        .mix_shared_secret(server_eph.private_key.serialize(), &client_static)
        .map_err(|x| e(&x))?;
    let payload = noise
        .decrypt(cf.payload.as_deref().unwrap_or_default())
        .map_err(|x| e(&x))?;
    let (c2s, s2c) = noise.finish().map_err(|x| e(&x))?;
    Ok((c2s, s2c, false, client_static, hello_of(&payload)?))
}
