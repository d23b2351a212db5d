/* TCP floor by send method, between simulated hosts (the git history of docs/benchmarks.md, "Across simulated
 * hosts", questioning the floor). Build: gcc -O2 -pthread -o /tmp/hb/fl tcp_floor_methods.c;
 * run through tcp_floor_methods.py. rx PORT NSTREAMS | tx IP PORT NSTREAMS write|splice|zc SECONDS [BLOCK] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <linux/errqueue.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static const char*method; static double secs; static size_t blk=1<<20; static int sndbuf=0;
static void*rx(void*a){int c=(int)(long)a; char*b=aligned_alloc(4096,blk); long long n=0; for(;;){ssize_t k=recv(c,b,blk,0); if(k<=0)break; n+=k;} printf("%lld\n",n); fflush(stdout); return 0;}
static void*tx(void*a){int c=(int)(long)a; char*b=aligned_alloc(4096,blk); memset(b,7,blk); double t=now();
 if(sndbuf) setsockopt(c,SOL_SOCKET,SO_SNDBUF,&sndbuf,4);
 if(!strcmp(method,"write")){ while(now()-t<secs){size_t o=0; while(o<blk){ssize_t k=write(c,b+o,blk-o); if(k<=0)return 0; o+=k;}}}
 else if(!strcmp(method,"splice")){int p[2]; pipe(p); fcntl(p[1],F_SETPIPE_SZ,(int)blk);
   while(now()-t<secs){ size_t o=0; while(o<blk){ struct iovec v={b+o,blk-o}; ssize_t k=vmsplice(p[1],&v,1,0); if(k<=0){perror("vmsplice");return 0;} size_t s=0; while(s<(size_t)k){ssize_t m=splice(p[0],0,c,0,k-s,SPLICE_F_MOVE|SPLICE_F_MORE); if(m<=0){perror("splice");return 0;} s+=m;} o+=k;}}}
 else if(!strcmp(method,"zc")){int one=1; setsockopt(c,SOL_SOCKET,SO_ZEROCOPY,&one,4); long outstanding=0; char cb[4096];
   while(now()-t<secs){size_t o=0; while(o<blk){ssize_t k=send(c,b+o,blk-o,MSG_ZEROCOPY); if(k<=0){break;} o+=k; outstanding++;}
     for(;;){struct msghdr m={0}; m.msg_control=cb; m.msg_controllen=sizeof cb; if(recvmsg(c,&m,MSG_ERRQUEUE|MSG_DONTWAIT)<0)break;} }}
 shutdown(c,SHUT_WR); return 0;}
int main(int argc,char**argv){ // fl rx port nstreams | fl tx ip port nstreams method secs
 int ns=atoi(argv[argc>4?4:3]); pthread_t th[16];
 if(!strcmp(argv[1],"rx")){int s=socket(AF_INET,SOCK_STREAM,0),one=1; setsockopt(s,SOL_SOCKET,SO_REUSEADDR,&one,4); struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(atoi(argv[2]))}; bind(s,(void*)&a,sizeof a); listen(s,16);
   for(int i=0;i<ns;i++){int c=accept(s,0,0); pthread_create(&th[i],0,rx,(void*)(long)c);} for(int i=0;i<ns;i++)pthread_join(th[i],0); return 0;}
 method=argv[5]; secs=atof(argv[6]); if(argc>7)blk=atol(argv[7]); if(argc>8)sndbuf=atoi(argv[8]);
 for(int i=0;i<ns;i++){int c=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(atoi(argv[3]))}; inet_pton(AF_INET,argv[2],&a.sin_addr); if(connect(c,(void*)&a,sizeof a)){perror("connect");return 1;} pthread_create(&th[i],0,tx,(void*)(long)c);}
 for(int i=0;i<ns;i++)pthread_join(th[i],0); return 0;}
