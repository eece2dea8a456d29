//! Unary gRPC calls straight over HTTP/2 streams, for the load generator.
//!
//! A load generator shares the machine with the server it measures, so every microsecond it spends per request is
//! taken from the server. tonic's client (its channel, hyper's client and a task spawned per request body) costs
//! about as much CPU per call as the server's whole decision; this client writes each call as one HEADERS and one
//! DATA frame on an `h2` stream and reads the answer back, still with prost's generated messages and the full gRPC
//! contract: `content-type: application/grpc`, length-prefixed messages, and `grpc-status` read from the trailers
//! (or from the headers of a trailers-only answer).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{HeaderMap, Request, Uri};

/// Why a call got no message back: the gRPC code it failed with.
pub(super) type CallError = tonic::Code;

/// One HTTP/2 connection; clones share it.
#[derive(Debug, Clone)]
pub(super) struct Connection {
    send: SendRequest<Bytes>,
}

impl Connection {
    /// Opens an HTTP/2 connection over `tcp` and drives it in a task of its own.
    pub async fn open(tcp: tokio::net::TcpStream) -> Result<Connection, h2::Error> {
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 24)
            .handshake(tcp)
            .await?;
        tokio::spawn(async move {
            // The connection ends with the load or with an error every open call then reports.
            let _ = connection.await;
        });
        Ok(Connection { send })
    }

    /// Calls the unary method at `uri` (scheme, authority and `/package.Service/Method`) with `message`.
    pub async fn unary<Q: prost::Message, R: prost::Message + Default>(
        &self,
        uri: &Uri,
        message: &Q,
    ) -> Result<R, CallError> {
        let mut send = self.send.clone().ready().await.map_err(|_| tonic::Code::Unavailable)?;
        let request = Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(())
            .map_err(|_| tonic::Code::Internal)?;
        let (response, mut stream) = send
            .send_request(request, false)
            .map_err(|_| tonic::Code::Unavailable)?;
        let length = message.encoded_len();
        let mut frame = BytesMut::with_capacity(5 + length);
        frame.put_u8(0);
        frame.put_u32(u32::try_from(length).map_err(|_| tonic::Code::Internal)?);
        message.encode_raw(&mut frame);
        stream
            .send_data(frame.freeze(), true)
            .map_err(|_| tonic::Code::Unavailable)?;

        let (parts, mut body) = response.await.map_err(|_| tonic::Code::Unavailable)?.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(tonic::Code::Unknown);
        }
        if let Some(code) = grpc_status(&parts.headers) {
            // A trailers-only answer: the call failed before any message.
            return Err(if code == tonic::Code::Ok {
                tonic::Code::Internal
            } else {
                code
            });
        }
        let mut received = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|_| tonic::Code::Unavailable)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            received.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(|_| tonic::Code::Unavailable)?;
        match trailers.as_ref().and_then(grpc_status) {
            Some(tonic::Code::Ok) => decode(received.freeze()),
            Some(code) => Err(code),
            None => Err(tonic::Code::Internal),
        }
    }
}

/// The `grpc-status` header, if present (an unreadable one counts as UNKNOWN).
fn grpc_status(headers: &HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?;
    let code = value.to_str().ok().and_then(|v| v.parse::<i32>().ok());
    Some(code.map_or(tonic::Code::Unknown, tonic::Code::from_i32))
}

/// Reads the one uncompressed, length-prefixed message of a unary answer.
fn decode<R: prost::Message + Default>(mut body: Bytes) -> Result<R, CallError> {
    if body.len() < 5 || body.get_u8() != 0 {
        return Err(tonic::Code::Internal);
    }
    let length = body.get_u32() as usize;
    if body.len() != length {
        return Err(tonic::Code::Internal);
    }
    R::decode(body).map_err(|_| tonic::Code::Internal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;

    fn framed(message: &RateLimitResponse) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(0);
        out.put_u32(prost::Message::encoded_len(message) as u32);
        prost::Message::encode_raw(message, &mut out);
        out.freeze()
    }

    #[test]
    fn answers_are_read_only_when_well_framed() {
        let response = RateLimitResponse {
            overall_code: 2,
            ..Default::default()
        };
        let body = framed(&response);
        assert_eq!(decode::<RateLimitResponse>(body.clone()), Ok(response));
        assert_eq!(
            decode::<RateLimitResponse>(body.slice(..body.len() - 1)),
            Err(tonic::Code::Internal)
        );
        let mut compressed = BytesMut::from(&body[..]);
        compressed[0] = 1;
        assert_eq!(
            decode::<RateLimitResponse>(compressed.freeze()),
            Err(tonic::Code::Internal)
        );
        assert_eq!(decode::<RateLimitResponse>(Bytes::new()), Err(tonic::Code::Internal));
    }

    #[test]
    fn status_codes_are_read_from_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(grpc_status(&headers), None);
        headers.insert("grpc-status", "8".parse().unwrap());
        assert_eq!(grpc_status(&headers), Some(tonic::Code::ResourceExhausted));
        headers.insert("grpc-status", "x".parse().unwrap());
        assert_eq!(grpc_status(&headers), Some(tonic::Code::Unknown));
    }
}
