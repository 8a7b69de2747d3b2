//! The response body of every endpoint: whole bytes (every JSON answer, with an exact length so
//! hyper sends `Content-Length`), or a stream of chunks (a `subscriptions/listen` SSE stream)
//! that ends when its sender is dropped.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::sync::mpsc;

/// A response body.
pub struct Body(Kind);

enum Kind {
    Whole(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body {
    /// A body of exactly `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        Self(Kind::Whole(Some(bytes).filter(|b| !b.is_empty())))
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self(Kind::Whole(None))
    }

    /// A body streamed from `rx`, chunk by chunk, until every sender is dropped.
    pub fn stream(rx: mpsc::Receiver<Bytes>) -> Self {
        Self(Kind::Stream(rx))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.0 {
            Kind::Whole(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Stream(rx) => rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(&self.0, Kind::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn whole_bodies_have_an_exact_length_and_streams_end_with_their_sender() {
        let b = Body::new(Bytes::from_static(b"{}"));
        assert_eq!(hyper::body::Body::size_hint(&b).exact(), Some(2));
        assert_eq!(b.collect().await.unwrap().to_bytes(), "{}");
        assert!(hyper::body::Body::is_end_stream(&Body::empty()));
        let (tx, rx) = mpsc::channel(4);
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        tx.send(Bytes::from_static(b"b")).await.unwrap();
        drop(tx);
        assert_eq!(Body::stream(rx).collect().await.unwrap().to_bytes(), "ab");
    }
}
