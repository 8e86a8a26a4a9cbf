package main

import (
	"context"
	"errors"
)

func serve(ctx context.Context, cfg *Config) error {
	return errors.New("daemon mode is not built in this version; use a subcommand")
}
