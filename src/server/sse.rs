//! Streaming answers: gateway events become Server-Sent Events in OpenAI's
//! chunk shapes, ending with `data: [DONE]`. Dropping the stream (a client
//! that went away) drops the ticket, which cancels the generation.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use serde_json::Value;

use super::error::ApiError;
use super::response::Reply;
use crate::gateway::{GatewayEvent, Ticket};

/// SSE comments keep idle streams (a long prefill) alive through proxies.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

fn done() -> Event {
    Event::default().data("[DONE]")
}

struct StreamState {
    ticket: Ticket,
    reply: Reply,
    /// Characters of completion text sent so far (completions' `text_offset`).
    offset: usize,
    finished: bool,
}

impl StreamState {
    fn on_event(&mut self, event: Option<GatewayEvent>) -> Vec<Event> {
        match event {
            Some(GatewayEvent::Started { .. }) => Vec::new(),
            Some(GatewayEvent::Token { text, logprob, .. }) => {
                if text.is_empty() && logprob.is_none() {
                    return Vec::new();
                }
                let chunk = self.reply.text_chunk(&text, logprob.as_ref(), self.offset);
                self.offset += text.chars().count();
                vec![data(&chunk)]
            }
            Some(GatewayEvent::Done(result)) => {
                self.finished = true;
                let mut events = vec![data(&self.reply.closing_chunk(&result))];
                if self.reply.include_usage {
                    events.push(data(&self.reply.usage_chunk(&result)));
                }
                events.push(done());
                events
            }
            Some(GatewayEvent::Failed(e)) => self.fail(ApiError::from(e)),
            None => self.fail(ApiError::internal("the generation ended unexpectedly")),
        }
    }

    fn fail(&mut self, error: ApiError) -> Vec<Event> {
        self.finished = true;
        vec![data(&error.body()), done()]
    }
}

/// The SSE response for a request whose generation has started.
pub fn stream(reply: Reply, ticket: Ticket) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let opening: Vec<Event> = reply.opening_chunk().iter().map(data).collect();
    let state = StreamState {
        ticket,
        reply,
        offset: 0,
        finished: false,
    };
    let body = stream::unfold(state, |mut state| async move {
        if state.finished {
            return None;
        }
        let event = state.ticket.events.recv().await;
        let out = state.on_event(event);
        Some((stream::iter(out), state))
    })
    .flatten();
    let events = stream::iter(opening).chain(body).map(Ok);
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
