package virt

import "context"

// The migration calls on a Lazy connection: each is the Conn method of the
// same name once connected (migrate.go, migrate_offline.go,
// migrate_xml.go, precheck.go). MigrateOffline, which needs both ends'
// connections, is Conn's only; hosts that each hold their own connection
// use DefineMigrated and UndefineMigrated.

// DomainXML is Conn.DomainXML once connected.
func (l *Lazy) DomainXML(ctx context.Context, ref string, inactive bool) (string, error) {
	c, err := l.get(ctx)
	if err != nil {
		return "", err
	}
	return c.DomainXML(ctx, ref, inactive)
}

// DestinationXML is Conn.DestinationXML once connected.
func (l *Lazy) DestinationXML(ctx context.Context, ref string, from, to Hostdev, toInstance string) (MigrationXML, error) {
	c, err := l.get(ctx)
	if err != nil {
		return MigrationXML{}, err
	}
	return c.DestinationXML(ctx, ref, from, to, toInstance)
}

// HostVersions is Conn.HostVersions once connected.
func (l *Lazy) HostVersions(ctx context.Context) (HostVersions, error) {
	c, err := l.get(ctx)
	if err != nil {
		return HostVersions{}, err
	}
	return c.HostVersions(ctx)
}

// PrecheckLive is Conn.PrecheckLive once connected.
func (l *Lazy) PrecheckLive(ctx context.Context, ref string, dst HostVersions) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.PrecheckLive(ctx, ref, dst)
}

// MigrateLive is Conn.MigrateLive once connected.
func (l *Lazy) MigrateLive(ctx context.Context, ref string, m LiveMigration) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.MigrateLive(ctx, ref, m)
}

// MigrationProgress is Conn.MigrationProgress once connected.
func (l *Lazy) MigrationProgress(ctx context.Context, ref string) (MigrationProgress, error) {
	c, err := l.get(ctx)
	if err != nil {
		return MigrationProgress{}, err
	}
	return c.MigrationProgress(ctx, ref)
}

// AbortMigration is Conn.AbortMigration once connected.
func (l *Lazy) AbortMigration(ctx context.Context, ref string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.AbortMigration(ctx, ref)
}

// DefineMigrated is Conn.DefineMigrated once connected.
func (l *Lazy) DefineMigrated(ctx context.Context, persistXML string) (Domain, error) {
	c, err := l.get(ctx)
	if err != nil {
		return Domain{}, err
	}
	return c.DefineMigrated(ctx, persistXML)
}

// UndefineMigrated is Conn.UndefineMigrated once connected.
func (l *Lazy) UndefineMigrated(ctx context.Context, ref string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.UndefineMigrated(ctx, ref)
}
