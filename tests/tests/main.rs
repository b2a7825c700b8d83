//! The end-to-end and chaos tests, one module per file, in one test binary: every file of its
//! own would link the harness and every broker's and database's client again.

mod aws;
mod dead_letters;
mod frozen_relay;
mod held_back;
mod matrix;
mod mysql_redis;
mod nats;
mod partition;
mod pause;
mod payloads;
mod pgbouncer;
mod pipelines;
mod postgres_kafka;
mod postgres_logical;
mod postgres_rabbitmq;
mod postgres_redis;
mod postgres_redis_tls;
mod postgres_sns;
mod postgres_sqs;
mod privileges;
mod rabbitmq_restart;
mod replay;
mod sigkills;
mod tls;
