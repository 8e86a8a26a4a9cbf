# Nova's own scheduler code (Debian's python3-nova) as a Placement client,
# for the fleet tests: the request parser nova-scheduler builds its
# allocation-candidates query with, and the report client it claims and
# deletes allocations with, unmodified. Run with Debian's /usr/bin/python3.
#
# Usage: novasched.py CONFIG_FILE. CONFIG_FILE is an oslo.config file with
# [placement] auth_type = admin_token, endpoint, token, region_name (no
# Keystone: Placement runs with noauth2).
#
# It speaks JSON lines: each request on stdin is an object with an "id"
# and an "op"; each answer on stdout carries the same "id", and either
# the op's fields or "error" (the exception's class and text). Requests are
# served on threads, so answers may come in another order; nova-scheduler
# serves many requests at once on one report client too.
#
# Ops:
#   query   {flavor: {vcpus, memory_mb, root_gb, extra_specs}, project_id, user_id}
#           → {query: the querystring nova-scheduler sends,
#              candidates: [allocation request, ...] (Placement's order),
#              version: the microversion they were asked at}
#           (candidates is null when Placement did not answer with them)
#   claim   {consumer, alloc_req, project_id, user_id, version}
#           → {claimed: claim_resources' answer (False: Placement refused)}
#   delete  {consumer} → {deleted: delete_allocation_for_instance(force=True)}
#   allocs  {consumer} → {allocations: get_allocs_for_consumer's document}
import json
import sys
import threading
import traceback

from nova import conf as nova_conf
from nova import context as nova_context
from nova import objects
from nova.scheduler.client import report
from nova.scheduler import utils as scheduler_utils

nova_conf.CONF(['--config-file', sys.argv[1]], project='nova')
objects.register_all()
CLIENT = report.SchedulerReportClient()
OUT = threading.Lock()


def request_spec(req):
    f = req['flavor']
    flavor = objects.Flavor(
        vcpus=f.get('vcpus', 0), memory_mb=f.get('memory_mb', 0),
        root_gb=f.get('root_gb', 0), ephemeral_gb=0, swap=0,
        extra_specs=f.get('extra_specs', {}))
    return objects.RequestSpec(
        flavor=flavor, image=objects.ImageMeta(properties=objects.ImageMetaProps()),
        is_bfv=False, project_id=req.get('project_id', 'fleet'),
        user_id=req.get('user_id', 'scheduler'))


def ctx(req):
    return nova_context.RequestContext(
        user_id=req.get('user_id', 'scheduler'), project_id=req.get('project_id', 'fleet'),
        is_admin=True)


def query(req):
    spec = request_spec(req)
    rr = scheduler_utils.ResourceRequest.from_request_spec(spec)
    res = CLIENT.get_allocation_candidates(ctx(req), rr)
    alloc_reqs, _, version = res
    return {'query': rr.to_querystring(), 'candidates': alloc_reqs, 'version': version}


def claim(req):
    # What nova.scheduler.utils.claim_resources does: a new consumer
    # (consumer_generation None), at the version the candidates came at.
    spec = request_spec(dict(req, flavor={}))
    ok = scheduler_utils.claim_resources(
        ctx(req), CLIENT, spec, req['consumer'], req['alloc_req'],
        allocation_request_version=req['version'])
    return {'claimed': bool(ok)}


def delete(req):
    # What the compute manager does before a reschedule.
    return {'deleted': bool(CLIENT.delete_allocation_for_instance(
        ctx(req), req['consumer'], force=True))}


def allocs(req):
    return {'allocations': CLIENT.get_allocs_for_consumer(ctx(req), req['consumer'])}


OPS = {'query': query, 'claim': claim, 'delete': delete, 'allocs': allocs}


def serve(line):
    req = {}
    try:
        req = json.loads(line)
        ans = OPS[req['op']](req)
    except Exception as e:  # every failure is an answer, never a dead driver
        ans = {'error': '%s: %s' % (type(e).__name__, e),
               'trace': traceback.format_exc(limit=3)}
    ans['id'] = req.get('id')
    with OUT:
        sys.stdout.write(json.dumps(ans) + '\n')
        sys.stdout.flush()


def main():
    with OUT:
        sys.stdout.write(json.dumps({'id': 0, 'ready': True}) + '\n')
        sys.stdout.flush()
    threads = []
    for line in sys.stdin:
        if line.strip():
            th = threading.Thread(target=serve, args=(line,), daemon=True)
            th.start()
            threads.append(th)
            threads = [th for th in threads if th.is_alive()]
    # stdin closed: answer what was asked, then end.
    for th in threads:
        th.join()


if __name__ == '__main__':
    main()
