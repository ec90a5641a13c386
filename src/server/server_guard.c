/* The connection guard: connection limits and the read deadline.
 *
 * libmicrohttpd's own limits close a connection past them at once, unanswered, and count a
 * connection that trickles its headers a byte a second the same as one being served; its
 * connection timeout counts idle time only, so such a connection (and, one thread per
 * connection, a thread) is kept forever. A few hundred of them locked everyone out, /health
 * included. So the limits are kept here instead, with libmicrohttpd's global one set higher as
 * a backstop:
 *
 * - A connection opened past the global or its address's limit takes the place of the oldest
 *   connection of that address (of any address, past the global limit) that has been sending
 *   a request for GUARD_SLOW_S or more without finishing it, or idling between requests as
 *   long: that one is shut down. A well-behaved client sends its request in milliseconds and
 *   is never the one replaced, and a client that holds connections open still gets its next
 *   request through, since each new connection of its address replaces one of its old ones.
 * - When there is none to replace, the connection is refused: its request, if it arrives
 *   within GUARD_REFUSED_S, gets a 503 that says which limit; else it is closed.
 * - Each connection must deliver its request within the read deadline of it opening or of its
 *   previous response, however steadily the bytes trickle in.
 *
 * A thread wakes a few times a second and shuts down the sockets of connections past their
 * deadline, which makes their threads see the end of the stream and close them. A record leaves
 * the list in the CLOSED notification, which libmicrohttpd sends before it closes the
 * descriptor: under guard_mu the descriptor of a listed record is still this connection's,
 * never a reused one. */
#include "server/server_internal.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define GUARD_PERIOD_MS 100
#define GUARD_SLOW_S    1.0 /* a request still arriving after this long may be replaced */
#define GUARD_REFUSED_S 1.0 /* a refused connection's request must arrive within this */

static void client_address(struct MHD_Connection *c, unsigned char key[17]) {
    memset(key, 0, 17);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (!sa) return;
    key[0] = (unsigned char)sa->sa_family;
    if (sa->sa_family == AF_INET)
        memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    else if (sa->sa_family == AF_INET6)
        memcpy(key + 1, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
}

/* Live connections (neither evicted nor refused) in all and from r's address. */
static void count_live(const server *s, const server_conn *r, unsigned *all, unsigned *same) {
    *all = *same = 0;
    for (const server_conn *o = s->conns; o; o = o->next) {
        if (o == r || o->evicted || o->refused) continue;
        (*all)++;
        if (memcmp(o->addr, r->addr, sizeof o->addr) == 0) (*same)++;
    }
}

/* The oldest connection slow to send its request, of r's address when same_address. */
static server_conn *slowest(const server *s, const server_conn *r, bool same_address, double now) {
    server_conn *best = NULL;
    for (server_conn *o = s->conns; o; o = o->next) {
        if (o == r || o->evicted || o->refused || !o->reading || now - o->since < GUARD_SLOW_S)
            continue;
        if (same_address && memcmp(o->addr, r->addr, sizeof o->addr) != 0) continue;
        if (!best || o->since < best->since) best = o;
    }
    return best;
}

/* Admits r (guard_mu held): within the limits, in place of a slow connection, or refused. */
static void admit(server *s, server_conn *r, double now) {
    unsigned all, same;
    count_live(s, r, &all, &same);
    bool ip_over = s->o.max_connections_ip && same >= s->o.max_connections_ip;
    bool all_over = all >= s->o.max_connections;
    if (!ip_over && !all_over) return;
    server_conn *victim = slowest(s, r, ip_over, now);
    if (!victim) {
        r->refused = true;
        __atomic_add_fetch(&s->n_refused, 1, __ATOMIC_RELAXED);
        return;
    }
    victim->evicted = true;
    victim->reading = false;
    shutdown(victim->fd, SHUT_RDWR);
    __atomic_add_fetch(&s->n_replaced, 1, __ATOMIC_RELAXED);
}

void server_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    server_conn *r = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) return;
        r = base_xcalloc(1, sizeof *r);
        r->fd = ci->connect_fd;
        client_address(c, r->addr);
        pthread_mutex_lock(&s->guard_mu);
        r->since = base_now();
        r->reading = true;
        admit(s, r, r->since);
        r->next = s->conns;
        if (s->conns) s->conns->prev = r;
        s->conns = r;
        pthread_mutex_unlock(&s->guard_mu);
        *socket_context = r;
        return;
    }
    if (!r) return;
    pthread_mutex_lock(&s->guard_mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        s->conns = r->next;
    if (r->next) r->next->prev = r->prev;
    pthread_mutex_unlock(&s->guard_mu);
    free(r);
    *socket_context = NULL;
}

static server_conn *record(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void server_guard_arm(server *s, struct MHD_Connection *c, bool armed) {
    server_conn *r = record(c);
    if (!r) return;
    pthread_mutex_lock(&s->guard_mu);
    r->reading = armed && !r->evicted;
    r->since = base_now();
    pthread_mutex_unlock(&s->guard_mu);
}

bool server_guard_refused(server *s, struct MHD_Connection *c) {
    server_conn *r = record(c);
    if (!r) return false;
    pthread_mutex_lock(&s->guard_mu);
    bool refused = r->refused;
    pthread_mutex_unlock(&s->guard_mu);
    return refused;
}

/* When the connection must have delivered its request; 0: no deadline. */
static double deadline(const server *s, const server_conn *r) {
    if (!r->reading) return 0;
    if (r->refused) return r->since + GUARD_REFUSED_S;
    return s->o.read_timeout_s > 0 ? r->since + (double)s->o.read_timeout_s : 0;
}

static void *guard_main(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->guard_mu);
    while (!s->guard_stop) {
        double now = base_now();
        for (server_conn *r = s->conns; r; r = r->next) {
            double d = deadline(s, r);
            if (d <= 0 || now < d) continue;
            shutdown(r->fd, SHUT_RDWR);
            r->reading = false;
            if (!r->refused) __atomic_add_fetch(&s->n_dropped, 1, __ATOMIC_RELAXED);
        }
        base_cond_wait_ms(&s->guard_cv, &s->guard_mu, GUARD_PERIOD_MS);
    }
    pthread_mutex_unlock(&s->guard_mu);
    return NULL;
}

int server_guard_start(server *s, base_err *err) {
    if (pthread_create(&s->guard, NULL, guard_main, s) != 0)
        return base_fail(err, "the server cannot start the thread that enforces its limits");
    s->guard_running = true;
    return 0;
}

void server_guard_stop(server *s) {
    if (s->guard_running) {
        pthread_mutex_lock(&s->guard_mu);
        s->guard_stop = true;
        pthread_cond_signal(&s->guard_cv);
        pthread_mutex_unlock(&s->guard_mu);
        pthread_join(s->guard, NULL);
        s->guard_running = false;
    }
}
