//! nightshift-proto: the versioned `nightshift.v1` gRPC schema between coordinator and expert
//! nodes, compiled at build time with protox (no system protoc). Holds no logic.
