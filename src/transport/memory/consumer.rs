//! Consumers and settlement: `basic.consume` (prefetch taken at consume time, exclusive),
//! dispatch round robin within each consumer's prefetch, `basic.get`, ack / nack / reject with
//! `multiple`, `basic.cancel`, and what a channel's or a connection's end does (unacked
//! requeued, consumers told, exclusive and auto-delete queues deleted).

use super::reply::{access_refused, not_emulated, precondition, Refused};
use super::state::{ConsumerEntry, End, State, Unacked};
use crate::transport::{AmqpError, ConsumerMessage, ConsumerOptions, Delivery, Get, Settle};

impl State {
    /// Delivers what `queue` has ready to its consumers with room, round robin.
    pub(super) fn dispatch(&mut self, queue: &str) {
        loop {
            self.expire(queue);
            if self.held_queues.contains(queue) {
                return;
            }
            let State {
                queues,
                conns,
                major,
                ..
            } = self;
            let Some(q) = queues.get_mut(queue) else {
                return;
            };
            if q.ready.is_empty() || q.consumers.is_empty() {
                return;
            }
            let n = q.consumers.len();
            let Some(at) = (0..n).map(|i| (q.rr + i) % n).find(|&i| {
                let c = &q.consumers[i];
                c.no_ack || c.prefetch == 0 || c.unacked < u32::from(c.prefetch)
            }) else {
                return;
            };
            q.rr = (at + 1) % n;
            let Some(msg) = q.ready.pop_front() else {
                return;
            };
            let properties = super::queue::delivered_properties(*major, Some(q), &msg);
            let c = &mut q.consumers[at];
            let Some(ch) = conns
                .get_mut(&c.conn)
                .and_then(|x| x.channels.get_mut(&c.chan))
            else {
                return;
            };
            ch.next_tag += 1;
            let tag = ch.next_tag;
            let d = Delivery::new(
                tag,
                msg.redelivered,
                msg.exchange.clone(),
                msg.routing_key.clone(),
                msg.body.clone(),
                properties,
                Settle::tag_only(),
            );
            if !c.no_ack {
                c.unacked += 1;
                let u = Unacked {
                    queue: queue.to_string(),
                    msg,
                    consumer: Some(c.tag.clone()),
                };
                ch.unacked.insert(tag, u);
            }
            let _ = c.tx.send(ConsumerMessage::Delivery(d));
        }
    }

    pub(super) fn consume(
        &mut self,
        conn: u64,
        chan: u16,
        queue: &str,
        o: &ConsumerOptions,
    ) -> Refused<(String, crossbeam_channel::Receiver<ConsumerMessage>)> {
        if let Some(key) = o.arguments.keys().find(|k| k.starts_with("x-")) {
            return Err(not_emulated(&format!("the consumer argument '{key}'")));
        }
        let tag = format!("amq.ctag-memory-{}", self.fresh_id());
        let prefetch = self.chan(conn, chan).map(|c| c.prefetch).unwrap_or(0);
        let q = self.owned(conn, queue)?;
        // RabbitMQ (3.10 and 4.0 alike) does not enforce an exclusive consume on a quorum queue.
        let exclusive = o.exclusive && !q.quorum;
        if !q.consumers.is_empty() && (exclusive || q.consumers.iter().any(|c| c.exclusive)) {
            return Err(access_refused(format!(
                "queue '{queue}' in vhost '/' in exclusive use"
            )));
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        q.consumers.push(ConsumerEntry {
            tag: tag.clone(),
            conn,
            chan,
            tx,
            no_ack: o.no_ack,
            prefetch,
            unacked: 0,
            exclusive,
        });
        q.had_consumer = true;
        if let Ok(ch) = self.chan(conn, chan) {
            ch.consumers.insert(tag.clone(), queue.to_string());
        }
        self.mark(queue);
        Ok((tag, rx))
    }

    /// Removes a consumer (it hears `said`, if anything); an auto-delete queue goes with its
    /// last consumer.
    pub(super) fn remove_consumer(
        &mut self,
        conn: u64,
        chan: u16,
        tag: &str,
        said: Option<ConsumerMessage>,
    ) {
        let queue = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.channels.get_mut(&chan))
            .and_then(|ch| ch.consumers.remove(tag));
        let Some(queue) = queue else {
            return;
        };
        let Some(q) = self.queues.get_mut(&queue) else {
            return;
        };
        if let Some(at) = q.consumers.iter().position(|c| c.tag == tag) {
            let c = q.consumers.remove(at);
            if let Some(m) = said {
                let _ = c.tx.send(m);
            }
            if q.rr > at {
                q.rr -= 1;
            }
        }
        if q.auto_delete && q.had_consumer && q.consumers.is_empty() {
            self.delete_queue(&queue);
        } else {
            self.mark(&queue);
        }
    }

    pub(super) fn get(
        &mut self,
        conn: u64,
        chan: u16,
        queue: &str,
        no_ack: bool,
    ) -> Refused<Option<Get>> {
        self.owned(conn, queue)?;
        self.expire(queue);
        let q = self.owned(conn, queue)?;
        let Some(msg) = q.ready.pop_front() else {
            return Ok(None);
        };
        // RabbitMQ drops what expired at the new head before it counts.
        self.expire(queue);
        let ready = self.queues.get(queue).map_or(0, |q| q.ready.len());
        let message_count = u32::try_from(ready).unwrap_or(u32::MAX);
        let properties = self.delivered(queue, &msg);
        self.mark(queue);
        let ch = self
            .chan(conn, chan)
            .expect("the channel is open: the caller checked it under this same lock");
        ch.next_tag += 1;
        let tag = ch.next_tag;
        let delivery = Delivery::new(
            tag,
            msg.redelivered,
            msg.exchange.clone(),
            msg.routing_key.clone(),
            msg.body.clone(),
            properties,
            Settle::tag_only(),
        );
        if !no_ack {
            let u = Unacked {
                queue: queue.to_string(),
                msg,
                consumer: None,
            };
            ch.unacked.insert(tag, u);
        }
        Ok(Some(Get {
            delivery,
            message_count,
        }))
    }

    /// ack (`requeue` None), or nack / reject: `multiple` covers every unacked tag up to `tag`
    /// (0 with `multiple`: all); the tag itself must be unacked (406 otherwise).
    pub(super) fn settle_tags(
        &mut self,
        conn: u64,
        chan: u16,
        tag: u64,
        multiple: bool,
        requeue: Option<bool>,
    ) -> Refused<()> {
        let ch = self
            .chan(conn, chan)
            .expect("the channel is open: the caller checked it under this same lock");
        let tags: Vec<u64> = if multiple && tag == 0 {
            ch.unacked.keys().copied().collect()
        } else if !ch.unacked.contains_key(&tag) {
            return Err(precondition(format!("unknown delivery tag {tag}")));
        } else if multiple {
            ch.unacked.range(..=tag).map(|(t, _)| *t).collect()
        } else {
            vec![tag]
        };
        let settled: Vec<Unacked> = tags.iter().filter_map(|t| ch.unacked.remove(t)).collect();
        for u in settled {
            self.release_slot(&u);
            match requeue {
                None => {}
                Some(true) => self.requeue(&u.queue, u.msg),
                Some(false) => self.dead_letter(&u.queue, u.msg, "rejected"),
            }
        }
        Ok(())
    }

    /// The consumer that had the message has room again.
    fn release_slot(&mut self, u: &Unacked) {
        let Some(tag) = &u.consumer else {
            return;
        };
        if let Some(q) = self.queues.get_mut(&u.queue) {
            if let Some(c) = q.consumers.iter_mut().find(|c| &c.tag == tag) {
                c.unacked = c.unacked.saturating_sub(1);
            }
            self.mark(&u.queue);
        }
    }

    /// Ends a channel: its consumers hear how (or disconnect on a cut), its unacked messages go
    /// back to their queues.
    pub(super) fn close_channel(&mut self, conn: u64, chan: u16, end: End) {
        let Some(ch) = self.conns.get(&conn).and_then(|c| c.channels.get(&chan)) else {
            return;
        };
        // Consumers first (nothing is redelivered to this channel), then the requeue.
        let mut tags: Vec<String> = ch.consumers.keys().cloned().collect();
        tags.sort();
        for tag in tags {
            let said = match &end {
                End::Client => Some(ConsumerMessage::ClientClosedChannel),
                End::Server(r) => Some(ConsumerMessage::ServerClosedChannel(r.error())),
                End::ConnectionClosed => Some(ConsumerMessage::ClientClosedConnection),
                End::Cut => None,
                End::ServerConnection(r) => Some(ConsumerMessage::ServerClosedConnection(
                    AmqpError::ServerClosedConnection {
                        code: r.code,
                        message: r.text.clone(),
                    },
                )),
            };
            self.remove_consumer(conn, chan, &tag, said);
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(ch) = c.channels.remove(&chan) else {
            return;
        };
        if let End::Server(r) = end {
            c.closed.insert(chan, Some(r));
        }
        for (_, u) in ch.unacked {
            self.requeue(&u.queue, u.msg);
        }
    }

    /// Ends a connection: its channels end, its exclusive queues are deleted, its blocked
    /// receiver disconnects, publishes an alarm held on it are lost.
    pub(super) fn close_connection(&mut self, conn: u64, end: End) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let mut chans: Vec<u16> = c.channels.keys().copied().collect();
        chans.sort_unstable();
        for chan in chans {
            self.close_channel(conn, chan, end.clone());
        }
        self.conns.remove(&conn);
        if let End::ServerConnection(r) = end {
            self.ended.insert(conn, Some(r));
        }
        let exclusive: Vec<String> = self
            .queues
            .iter()
            .filter(|(_, q)| q.owner == Some(conn))
            .map(|(n, _)| n.clone())
            .collect();
        for q in exclusive {
            self.delete_queue(&q);
        }
    }
}
