//! QUIC between clients and nodes, with the node's identity pinned.
//!
//! A node's identity is its ed25519 key (the peer id `metatopia init` prints). It serves QUIC with
//! a self-signed certificate made from that very key ([`server_config`]). A client that knows the
//! key (from a join address `KEY@HOST:PORT`, or from a route answer of a node it already trusts)
//! accepts the connection only if the TLS 1.3 handshake is signed by that key
//! ([`client_config`]): the certificate's contents are ignored, the signature over the handshake
//! is what proves the node holds the key. No certificate authorities are involved.

use std::sync::Arc;

use crate::error::ClientError;
use std::time::Duration;

use ed25519_dalek::{Signature, SigningKey, Verifier, VerifyingKey};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::proto::ALPN;

/// The name clients ask for (the certificate is self-signed and pinned by key, not by name).
pub const SERVER_NAME: &str = "metatopia-node";

/// An ed25519 key as PKCS#8 v2 DER (RFC 5958: the seed and the public key).
pub fn pkcs8_der(key: &SigningKey) -> Vec<u8> {
    let mut der = vec![0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    der.extend_from_slice(&key.to_bytes());
    der.extend_from_slice(&[0x81, 0x21, 0x00]);
    der.extend_from_slice(key.verifying_key().as_bytes());
    der
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(10_000))));
    t.keep_alive_interval(Some(Duration::from_secs(2)));
    // A client that does not keep up is told by flow control soon (the node's session then waits
    // and skips ticks; its next delta brings the client up to date), and a node with a thousand
    // clients does not buffer megabytes for each: 32 KiB in flight per stream, 64 KiB per
    // connection (a delta is a few KiB; a whole area on login, up to a few hundred, flows on
    // over a few round trips). What is in flight is also what an answer waits behind: with
    // 128 KiB, ten seconds of a crowd's deltas at 12 KB/s, and a seventh of 1,000 bots gave up
    // waiting for their avatar after logging in; with 32 KiB a twentieth (docs/benchmarks.md).
    t.stream_receive_window(quinn::VarInt::from_u32(32 * 1024));
    t.receive_window(quinn::VarInt::from_u32(64 * 1024));
    t.send_window(32 * 1024);
    // One control stream per client; nobody needs more.
    t.max_concurrent_bidi_streams(quinn::VarInt::from_u32(2));
    t.max_concurrent_uni_streams(quinn::VarInt::from_u32(0));
    Arc::new(t)
}

/// The socket buffers a QUIC endpoint asks for, each way. A node's gateway takes every
/// client's datagrams on one socket, and a bot process a hundred clients' on each: with the
/// kernel's default (208 KiB) the deltas of one tick, all sent in the same millisecond, came in
/// faster than the endpoint's task read them, and one datagram in ten was dropped on loopback
/// with 500 bots (`RcvbufErrors` in `/proc/net/snmp`). A lost handshake packet waits out
/// QUIC's retransmission timer, doubling each time: logins failed after ten seconds. The
/// kernel caps the request (`net.core.rmem_max`, `wmem_max`); the endpoint works with less.
pub const SOCKET_BUFFER: usize = 4 << 20;

/// A UDP socket bound to `addr` for a QUIC endpoint, with [`SOCKET_BUFFER`]s asked for (what
/// the kernel grants is logged at debug level).
pub fn udp_socket(addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(false);
    }
    // Best effort: a kernel that refuses leaves the default, which works at lower load.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    tracing::debug!(
        recv = socket.recv_buffer_size().unwrap_or(0),
        send = socket.send_buffer_size().unwrap_or(0),
        "QUIC socket buffers"
    );
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A QUIC endpoint on `addr` ([`udp_socket`]): a server when given its config, else a client.
pub fn endpoint(addr: std::net::SocketAddr, server: Option<quinn::ServerConfig>) -> std::io::Result<quinn::Endpoint> {
    let runtime = quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime found"))?;
    let socket = runtime.wrap_udp_socket(udp_socket(addr)?)?;
    quinn::Endpoint::new_with_abstract_socket(quinn::EndpointConfig::default(), server, socket, runtime)
}

fn quic(e: impl std::fmt::Display) -> ClientError {
    ClientError::Quic(e.to_string())
}

/// The node's QUIC server configuration: a self-signed certificate made from its key.
pub fn server_config(key: &SigningKey) -> Result<quinn::ServerConfig, ClientError> {
    let der = pkcs8_der(key);
    let pkcs8 = PrivatePkcs8KeyDer::from(der.clone());
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ED25519).map_err(quic)?;
    let cert =
        rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(quic)?.self_signed(&pair).map_err(quic)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(quic)?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der)))
        .map_err(quic)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(quic)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(transport());
    Ok(config)
}

/// A client configuration that accepts only a node holding `pinned`.
pub fn client_config(pinned: VerifyingKey) -> Result<quinn::ClientConfig, ClientError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(quic)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned(pinned)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(quic)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport());
    Ok(config)
}

/// Accepts a server whose TLS 1.3 handshake signature verifies under the pinned ed25519 key.
#[derive(Debug)]
struct Pinned(VerifyingKey);

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The certificate proves nothing by itself; the handshake signature below does.
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not spoken here".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        _cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme != SignatureScheme::ED25519 {
            return Err(rustls::Error::General(format!("the node signed with {:?}, not ed25519", dss.scheme)));
        }
        let sig = Signature::from_slice(dss.signature())
            .map_err(|_| rustls::Error::General("a malformed ed25519 signature".into()))?;
        self.0.verify(message, &sig).map_err(|_| {
            rustls::Error::General(
                "the node is not the one asked for: its handshake is not signed by the pinned key".into(),
            )
        })?;
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

pub use crate::keys::parse_public;

/// The first address `HOST:PORT` resolves to.
pub(crate) fn resolve(addr: &str) -> Result<std::net::SocketAddr, ClientError> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .map_err(|e| ClientError::Address(format!("resolving {addr}: {e}")))?
        .next()
        .ok_or_else(|| ClientError::Address(format!("{addr} resolves to no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server(key: &SigningKey) -> (quinn::Endpoint, std::net::SocketAddr) {
        let ep = quinn::Endpoint::server(server_config(key).unwrap(), "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = ep.local_addr().unwrap();
        let server = ep.clone();
        tokio::spawn(async move {
            while let Some(incoming) = server.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let data = recv.read_to_end(1024).await.unwrap_or_default();
                        let _ = send.write_all(&data).await;
                        let _ = send.finish();
                    }
                });
            }
        });
        (ep, addr)
    }

    async fn dial(addr: std::net::SocketAddr, pinned: VerifyingKey) -> anyhow::Result<Vec<u8>> {
        // The endpoint every client makes (`Client::endpoint_for`).
        let mut ep = endpoint("127.0.0.1:0".parse().unwrap(), None)?;
        ep.set_default_client_config(client_config(pinned)?);
        let conn = ep.connect(addr, SERVER_NAME)?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(b"hello").await?;
        send.finish()?;
        Ok(recv.read_to_end(1024).await?)
    }

    #[tokio::test]
    async fn a_client_reaches_the_pinned_node_and_refuses_any_other() {
        let node = SigningKey::from_bytes(&[7; 32]);
        let impostor = SigningKey::from_bytes(&[8; 32]);
        let (_ep, addr) = echo_server(&node).await;
        assert_eq!(dial(addr, node.verifying_key()).await.unwrap(), b"hello");
        let err = dial(addr, impostor.verifying_key()).await.unwrap_err();
        assert!(format!("{err:#}").contains("not the one asked for"), "{err:#}");
    }

    /// A QUIC socket (a node's, or one a hundred bots share) asks for [`SOCKET_BUFFER`] each
    /// way: Linux grants up to `net.core.rmem_max` / `wmem_max` and reports twice what it
    /// grants. (Client sockets left at the default dropped one datagram in nine with 1,000
    /// bots on this machine, and connections timed out.)
    #[cfg(target_os = "linux")]
    #[test]
    fn quic_sockets_get_the_buffers_the_kernel_allows_up_to_socket_buffer() {
        let read = |p: &str| std::fs::read_to_string(p).unwrap().trim().parse::<usize>().unwrap();
        let (rmax, wmax) = (read("/proc/sys/net/core/rmem_max"), read("/proc/sys/net/core/wmem_max"));
        let s = udp_socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let s = socket2::SockRef::from(&s);
        assert_eq!(s.recv_buffer_size().unwrap(), 2 * SOCKET_BUFFER.min(rmax));
        assert_eq!(s.send_buffer_size().unwrap(), 2 * SOCKET_BUFFER.min(wmax));
    }

    #[test]
    fn pkcs8_is_what_ring_reads_back() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(pkcs8_der(&key)),
            &rcgen::PKCS_ED25519,
        )
        .unwrap();
        use rcgen::PublicKeyData;
        assert_eq!(pair.der_bytes(), key.verifying_key().as_bytes());
        assert!(parse_public(&crate::proto::hex(key.verifying_key().as_bytes())).is_ok());
        assert!(parse_public("00").is_err());
    }
}
