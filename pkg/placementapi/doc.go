// Package placementapi is a client of the OpenStack Placement API: JSON over
// HTTP, one microversion negotiated at the first call, a keystone token or
// noauth2 credentials from the configuration, a deadline on every call,
// bounded retries with backoff, and the generation protocol (409
// placement.concurrent_update) exposed as ErrConflict so that callers
// re-read the generation and retry.
//
// Microversions: the client asks for 1.39 (Placement 8.0.0, OpenStack Zed)
// and accepts no server whose newest is below MinVersion (1.38): nested
// providers and in_tree need 1.14, granular request groups (resourcesN) 1.25,
// consumer generations 1.28, consumer_type 1.38. A server that refuses the
// version (406) is ErrVersion.
//
// Malformed answers (ErrMalformed), server errors (ErrServer), redirects
// (ErrRedirect, never followed: a redirect could take the token elsewhere),
// answers larger than MaxBody (ErrTooLarge) and unreachable servers
// (ErrUnreachable) are named, so callers log and count them by kind.
//
// It is unrelated to pkg/placement, the host's local allocator.
//
// Imports: nothing from vgpud.
package placementapi
