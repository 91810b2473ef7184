// Package registry reads record values framed in the Confluent Schema
// Registry wire format — a zero magic byte, a 4-byte big-endian schema id,
// for Protobuf the message-index array, then the encoded value — into the
// JSON that becomes an event's value (and a SQL handler's payload). It is
// the step between the Kafka record and the event in onceflow's data flow:
// package processor calls it while decoding a record, when
// decode.format is avro or protobuf.
//
// Writer schemas are fetched by id from a registry that speaks Confluent's
// REST API (franz-go's pkg/sr client), with their references, compiled
// once and kept in a bounded cache shared by every partition. A Protobuf
// schema or reference is .proto text or a base64 serialized
// FileDescriptorProto (the form Confluent's Python serializer registers).
//
// # What a value becomes
//
// Avro: the writer schema decides, not a reader schema, so records written
// with every version of a subject are read as they were written; the
// mapping is the table in docs/sql-handlers.md ("Avro and Protobuf
// values"). Protobuf: the canonical proto3 JSON mapping (package protojson)
// with the .proto field names and every field present.
//
// # Errors, by class
//
// A value the registry cannot help with is a *DataError naming the schema
// id (and the subject when the registry knows it): not framed, a schema
// id the registry does not know, a truncated or corrupt body, a schema
// that does not compile. Processor turns it into a dead letter.
// [IsTransient] errors — the registry unreachable, timing out, answering
// 5xx or 429 — say nothing about the value: the caller retries.
// [IsAuth] errors — 401 or 403 — are configuration: nothing succeeds until
// the credentials change, so the caller stops.
package registry
